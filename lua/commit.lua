-- commit: the owner of a call records that the tool returned, with its result.
-- KEYS[1]  the call's record
-- ARGV[1]  owner token (packed)  ARGV[2]  "1" when a value is stored, "0" when the result was not storable
-- ARGV[3]  value bytes           ARGV[4]  mac bytes ("" for none)
-- ARGV[5]  committed TTL ms      ARGV[6]  now, ms since the epoch
-- ARGV[7]  idempotency key (packed)  ARGV[8]  tool name     ARGV[9]  attempt number
-- ARGV[10] what this attempt's begin wrote, when it was a plain SET NX   ARGV[11] the committed record
--          made of it, but for the value (both optional: see the common case below)
-- Returns "ok" (committed, or already committed by this owner: a re-send),
--         "recreated" (no record was left: the pending one expired or was given back while the tool ran;
--                     the call ran, so it is written again, committed),
--         "superseded" (another attempt or an operator owns the record, or the key holds a string that
--                     is not a record of this layout: a damaged one, or one of a newer layout, which
--                     stays as it is). A key of another Redis type is an error (WRONGTYPE), as the GET
--                     below raises it.

-- The common case first, before the shared helpers are defined (making them was about a third of
-- this script's server time, and this case needs none of them): the commit of an attempt whose begin
-- wrote its record with a plain SET NX (redis_store.py). The client sends what that begin wrote
-- (ARGV[10]) and the committed record it makes of it, all but the value (ARGV[11],
-- layout.pack_committed_head; the value is ARGV[3]). When the key holds exactly those bytes it is
-- this attempt's own pending record, untouched since its begin (nobody waits for it, nothing was
-- released, no operator or other attempt wrote it: each would have changed it), and the committed
-- record replaces it unread, as `write` would have written it (test_layout checks both writers
-- against layout.pack). Anything else goes on to the script below, which decides as for any record:
-- other bytes, a client that sent only ARGV[1..9] (an earlier release, or a begin that ran this
-- script), a TTL that ttl_arg below refuses, a SET refused here (OOM: set_px handles it).
-- What it buys (Redis 7.0.15, EVALSHA, commandstats, medians of 5 rounds of 6,000-8,000 commits back
-- to back, two runs): 6-11 us of server time per commit, against 11-14 us through a pattern match of
-- the record and 18-24 us through the one parse and write (docs/performance.md).
do
  local ttl = tonumber(ARGV[5])
  if #ARGV >= 11 and ARGV[10] ~= '' and ttl and ttl >= 1 and ttl <= 315360000000 and ttl % 1 == 0
      and redis.call('GET', KEYS[1]) == ARGV[10] then
    if not redis.pcall('SET', KEYS[1], ARGV[11] .. ARGV[3], 'PX', ttl).err then
      return 'ok'
    end
  end
end

-- (the shared helpers are defined here)
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
