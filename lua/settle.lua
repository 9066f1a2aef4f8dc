-- settle: the owner of a pending call that did not commit marks it unknown or releases it.
-- KEYS[1]  the call's record
-- ARGV[1]  owner token    ARGV[2]  "unknown" or "release"    ARGV[3]  unknown TTL ms
-- Returns "ok" (done, or nothing left to do: a re-send), "superseded" (another owner), "missing" (no record).
-- Only a pending record changes: a committed one is never released or marked unknown here.
local f = redis.call('HMGET', KEYS[1], 'status', 'owner')
if not f[1] then
  return 'missing'
end
if f[2] ~= ARGV[1] then
  return 'superseded'
end
if f[1] == 'pending' then
  if ARGV[2] == 'release' then
    redis.call('DEL', KEYS[1])
  else
    redis.call('HSET', KEYS[1], 'status', 'unknown')
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
  end
end
return 'ok'
