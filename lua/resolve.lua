-- resolve: an operator's verdict on a call, after asking the backend about its idempotency key.
-- KEYS[1]  the call's record
-- ARGV[1]  "committed", "unknown" or "release"    ARGV[2]  expected idempotency key ("" to skip the check)
-- ARGV[3]  new owner token (fences off any attempt still running)
-- ARGV[4]  "1" when a value is given             ARGV[5]  value bytes    ARGV[6]  mac bytes
-- ARGV[7]  TTL ms for the new status             ARGV[8]  now, ms since the epoch
-- Returns "ok", "missing" (no record) or "mismatch" (the record's key is not the expected one).
-- A hash that lost its status field (damaged) is still a record here, so an operator can resolve it.
local f = redis.call('HMGET', KEYS[1], 'status', 'key', 'tool', 'owner')
if not f[1] and not f[2] and not f[3] and not f[4] then
  return 'missing'
end
if ARGV[2] ~= '' and f[2] ~= ARGV[2] then
  return 'mismatch'
end
if ARGV[1] == 'release' then
  redis.call('DEL', KEYS[1])
  return 'ok'
end
if ARGV[1] == 'committed' then
  redis.call('HSET', KEYS[1], 'status', 'committed', 'owner', ARGV[3], 'stored', ARGV[4], 'value', ARGV[5],
    'mac', ARGV[6], 'committed', ARGV[8])
else
  redis.call('HSET', KEYS[1], 'status', 'unknown', 'owner', ARGV[3])
end
redis.call('PEXPIRE', KEYS[1], ARGV[7])
return 'ok'
