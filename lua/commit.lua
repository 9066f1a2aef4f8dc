-- commit: the owner of a call records that the tool returned, with its result.
-- KEYS[1]  the call's record
-- ARGV[1]  owner token (packed)  ARGV[2]  "1" when a value is stored, "0" when the result was not storable
-- ARGV[3]  value bytes           ARGV[4]  mac bytes ("" for none)
-- ARGV[5]  committed TTL ms      ARGV[6]  now, ms since the epoch
-- ARGV[7]  idempotency key (packed)  ARGV[8]  tool name     ARGV[9]  attempt number
-- Returns "ok" (committed, or already committed by this owner: a re-send),
--         "recreated" (no record was left: the pending one expired or was given back while the tool ran;
--                     the call ran, so it is written again, committed),
--         "superseded" (another attempt or an operator owns the record, or the key holds a string that
--                     is not a record of this layout: a damaged one, or one of a newer layout, which
--                     stays as it is). A key of another Redis type is an error (WRONGTYPE), as the GET
--                     below raises it.
ends_a_call = true
local record = KEYS[1]
local token, stored, value, mac = ARGV[1], ARGV[2] == '1' and '1' or '0', ARGV[3], ARGV[4]
local ttl = ttl_arg(ARGV[5])
local now = digits_arg(ARGV[6], 15)

local function write_committed(r)
  r.status, r.stored, r.value, r.mac, r.committed = 'committed', stored, value, mac, now
  write(record, r, ttl)
end

local raw = redis.call('GET', record)
if raw and commit_in_place(record, raw, token, stored, value, mac, now, ttl) then
  return 'ok'  -- the common case: this attempt's own pending record, as its begin wrote it
end
local r = raw and parse(raw)
if not raw or (r and r.status == RELEASED) then
  local released = r and r.released or ''
  write_committed({key = ARGV[7], tool = ARGV[8], owner = token, attempt = digits_arg(ARGV[9], 9),
    released = released})
  return 'recreated'
end
if not r or r.owner ~= token then
  return 'superseded'
end
if r.status ~= 'committed' then
  write_committed(r)
  wake(r, 'committed')  -- the calls waiting for this attempt (common.lua)
end
return 'ok'
