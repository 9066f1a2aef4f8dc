-- settle: the owner of a pending call that did not commit marks it unknown or releases it.
-- KEYS[1]  the call's record
-- ARGV[1]  owner token    ARGV[2]  "unknown" or "release"    ARGV[3]  unknown TTL ms
-- ARGV[4]  idempotency key    ARGV[5]  tool name    ARGV[6]  attempt number    ARGV[7]  tombstone TTL ms
-- Returns "ok" (done, or nothing left to do: a re-send), "superseded" (another owner, or the key holds no
--         record), "missing" (release: there was no record; a tombstone now keeps a late begin of this
--         attempt out), "recreated" (unknown: there was no record; the call is written again, unknown).
-- Release leaves a tombstone of the token rather than nothing (see common.lua). Only a pending record
-- changes: a committed or unknown one is never released or marked here.
local record = KEYS[1]
local token, settlement = ARGV[1], ARGV[2]
local unknown_ttl, tombstone_ttl = ttl_arg(ARGV[3]), ttl_arg(ARGV[7])

local f = redis.call('HMGET', record, 'status', 'owner', released_field(token))
local status, owner = f[1], f[2]
if status == RELEASED and f[3] then
  return 'ok'  -- this attempt released it already: a re-send
end
if (status == RELEASED and owner ~= token) or (not status and redis.call('EXISTS', record) == 0) then
  if settlement == 'release' then
    bury(record, token, tombstone_ttl)
    return 'missing'
  end
  redis.call('HSET', record, 'status', 'unknown', 'key', ARGV[4], 'tool', ARGV[5], 'owner', token,
    'attempt', ARGV[6])
  redis.call('PEXPIRE', record, unknown_ttl)
  return 'recreated'
end
if owner ~= token or not status then
  return 'superseded'
end
if status == 'pending' then
  if settlement == 'release' then
    bury(record, token, tombstone_ttl)
  else
    redis.call('HSET', record, 'status', 'unknown')
    redis.call('PEXPIRE', record, unknown_ttl)
  end
end
return 'ok'
