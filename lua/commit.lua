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

-- The common case first, before the shared helpers are defined (making them is about a third of this
-- script's server time, and this case needs none of them): this attempt's own pending record as its
-- begin wrote it on a key that held nothing (no MAC, no released list, no value; layout a, or layout
-- b with nobody waiting), rewritten committed without being parsed into a table, byte for byte what
-- `write` makes of it (test_layout checks both against layout.pack). A committed record is layout a,
-- without the lease. Anything else, a bad argument included, goes on to the script below, which
-- decides as for any record and raises for a bad argument: nothing is written here unless every
-- argument passes the checks ttl_arg and digits_arg make below. A SET refused here (OOM) goes on too,
-- to set_px's handling of it.
-- What it buys (Redis 7.0.15, EVALSHA, commandstats, medians of 5 rounds of 8,000 commits): about
-- 10-11.5 us of server time per commit, against 15-18 us with the helpers made first.
do
  local raw = redis.call('GET', KEYS[1])
  local ttl, now = tonumber(ARGV[5]), ARGV[6]
  if raw and #ARGV >= 6 and ttl and ttl >= 1 and ttl <= 315360000000 and ttl % 1 == 0 and #now <= 15
      and string.find(now, '^%d+$') then
    local _, stop, attempt, begun, lo, lk, lt = string.find(raw, '^ap,(%d+),(%d*),,0,(%d+),(%d+),(%d+),0,0;')
    if not stop then
      _, stop, attempt, begun, lo, lk, lt =
        string.find(raw, '^bp,(%d+),(%d*),,0,%d+,%d+,0,(%d+),(%d+),(%d+),0,0;')
    end
    if stop and #attempt <= 9 and #begun <= 15 and #lo <= 9 and #lk <= 9 and #lt <= 9 then
      local owner_end = stop + tonumber(lo)
      if #raw == owner_end + tonumber(lk) + tonumber(lt) and string.sub(raw, stop + 1, owner_end) == ARGV[1] then
        local mac = ARGV[4]
        local committed = table.concat({
          'ac,', attempt, ',', begun, ',', now, ',', ARGV[2] == '1' and '1' or '0', ',', lo, ',', lk, ',', lt,
          ',', #mac, ',0;', string.sub(raw, stop + 1), mac, ARGV[3],
        })
        if not redis.pcall('SET', KEYS[1], committed, 'PX', ttl).err then
          return 'ok'
        end
      end
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
