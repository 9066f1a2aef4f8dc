-- commit: the owner of a call records that the tool returned, with its result.
-- KEYS[1]  the call's record
-- ARGV[1]  owner token       ARGV[2]  "1" when a value is stored, "0" when the result was not storable
-- ARGV[3]  value bytes       ARGV[4]  mac bytes ("" for none)
-- ARGV[5]  committed TTL ms  ARGV[6]  now, ms since the epoch
-- ARGV[7]  idempotency key   ARGV[8]  tool name     ARGV[9]  attempt number
-- Returns "ok" (committed, or already committed by this owner: a re-send),
--         "recreated" (no record was left: the pending one expired or was given back while the tool ran;
--                     the call ran, so it is written again, committed),
--         "superseded" (another attempt or an operator owns the record, or the key holds no record).
local record = KEYS[1]
local token, stored, value, mac, now = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[6]
local ttl = ttl_arg(ARGV[5])

local function write_committed()
  redis.call('HSET', record, 'status', 'committed', 'stored', stored, 'value', value, 'mac', mac,
    'committed', now)
  redis.call('PEXPIRE', record, ttl)
end

local f = redis.call('HMGET', record, 'status', 'owner')
local status, owner = f[1], f[2]
if status == RELEASED or (not status and redis.call('EXISTS', record) == 0) then
  redis.call('HSET', record, 'key', ARGV[7], 'tool', ARGV[8], 'owner', token, 'attempt', ARGV[9])
  write_committed()
  return 'recreated'
end
if owner ~= token or not status then
  return 'superseded'
end
if status ~= 'committed' then
  write_committed()
end
return 'ok'
