-- resolve: an operator's verdict on a call, after asking the backend about its idempotency key, applied
-- only to the record the operator was shown.
-- KEYS[1]  the call's record
-- ARGV[1]  "committed", "unknown" or "release"    ARGV[2]  expected idempotency key ("" to skip the check)
-- ARGV[3]  the verdict's owner token (fences off any attempt still running; the same on a re-send)
-- ARGV[4]  "1" when a value is given             ARGV[5]  value bytes    ARGV[6]  mac bytes
-- ARGV[7]  TTL ms for the new status (release: the tombstone's)         ARGV[8]  now, ms since the epoch
-- ARGV[9]  expected status ("" to skip)           ARGV[10] expected owner token ("" to skip)
-- Returns "ok" (done, or this verdict was already applied: a re-send), "missing" (no record),
--         "mismatch" (the record's key is not the expected one), "changed" (the record's status or
--         owner is not the one shown: it moved on, e.g. the tool committed, and nothing is changed).
-- A hash that lost its status field (damaged) is still a record here, so an operator can resolve it.
local record = KEYS[1]
local verdict, expect_key, operator = ARGV[1], ARGV[2], ARGV[3]
local expect_status, expect_owner = ARGV[9], ARGV[10]
local ttl = ttl_arg(ARGV[7])

local f = redis.call('HMGET', record, 'status', 'key', 'owner', released_field(operator))
local status, rkey, owner = f[1], f[2], f[3]
if owner == operator or f[4] then
  return 'ok'  -- this verdict, sent again: it was applied (a release, even if a retry began since)
end
if status == RELEASED or (not status and redis.call('EXISTS', record) == 0) then
  return 'missing'
end
if expect_key ~= '' and rkey ~= expect_key then
  return 'mismatch'
end
if (expect_status ~= '' and status ~= expect_status) or (expect_owner ~= '' and owner ~= expect_owner) then
  return 'changed'
end
if verdict == 'release' then
  bury(record, operator, ttl)
  return 'ok'
end
if verdict == 'committed' then
  redis.call('HSET', record, 'status', 'committed', 'owner', operator, 'stored', ARGV[4], 'value', ARGV[5],
    'mac', ARGV[6], 'committed', ARGV[8])
else
  redis.call('HSET', record, 'status', 'unknown', 'owner', operator)
end
redis.call('PEXPIRE', record, ttl)
return 'ok'
