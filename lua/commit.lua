-- commit: the owner of a call records that the tool returned, with its result.
-- KEYS[1]  the call's record
-- ARGV[1]  owner token       ARGV[2]  "1" when a value is stored, "0" when the result was not storable
-- ARGV[3]  value bytes       ARGV[4]  mac bytes ("" for none)
-- ARGV[5]  committed TTL ms  ARGV[6]  now, ms since the epoch
-- Returns "ok" (committed, or already committed by this owner: a re-send),
--         "superseded" (another attempt or an operator owns the record), "missing" (no record).
local f = redis.call('HMGET', KEYS[1], 'status', 'owner')
if not f[1] then
  return 'missing'
end
if f[2] ~= ARGV[1] then
  return 'superseded'
end
if f[1] ~= 'committed' then
  redis.call('HSET', KEYS[1], 'status', 'committed', 'stored', ARGV[2], 'value', ARGV[3], 'mac', ARGV[4],
    'committed', ARGV[6])
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
end
return 'ok'
