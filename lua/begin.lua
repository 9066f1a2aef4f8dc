-- begin: record a tool call pending for one attempt, or report what an earlier attempt left.
-- KEYS[1]  the call's record (a hash)
-- ARGV[1]  idempotency key of this call      ARGV[2]  tool name
-- ARGV[3]  owner token of this attempt        ARGV[4]  "1" when the tool is reversible, else "0"
-- ARGV[5]  pending TTL in ms                  ARGV[6]  now, ms since the epoch
-- Returns {outcome, attempt, value, mac, tool, key}; value, mac, tool and key only where noted:
--   {"started", n}                   this attempt owns the record (new, re-sent, or a reversible take-over)
--   {"committed", n, value, mac}     an earlier attempt committed; value is absent when it was not storable
--   {"pending", n} / {"unknown", n}  an earlier attempt is in doubt and the tool is not reversible
--   {"mismatch", n, false, false, tool, key}  the id belongs to another tool or other arguments
--   {"corrupt", n, false, false, why}  the key holds no well-formed record: nothing is changed and the
--                                    caller must not run the tool
--   {"released", 0}                  this attempt already gave the record back (a begin that arrived
--                                    late, whatever the key holds now): nothing is written
-- Safe to re-send: the same token finds itself the owner, answers "started" again, and writes again so
-- that a WAIT sent after it on the same connection covers the record (Redis 7.2+ counts only the
-- connection's own writes). Replies use false, not nil, for absent items: a nil would end the array.
local record = KEYS[1]
local key, tool, token, reversible, now = ARGV[1], ARGV[2], ARGV[3], ARGV[4] == '1', ARGV[6]
local pending_ttl = ttl_arg(ARGV[5])

local function start(attempt)
  redis.call('HSET', record, 'status', 'pending', 'key', key, 'tool', tool, 'owner', token,
    'attempt', attempt, 'begun', now)
  redis.call('PEXPIRE', record, pending_ttl)
  return {'started', attempt}
end

local function corrupt(attempt, why)
  return {'corrupt', attempt or 0, false, false, why}
end

local f = redis.call('HMGET', record, 'status', 'key', 'tool', 'owner', 'attempt', 'stored', 'value', 'mac',
  released_field(token))
local status, rkey, rtool, owner, stored, value, mac = f[1], f[2], f[3], f[4], f[6], f[7], f[8]
if f[9] then
  return {'released', 0}
end
if not status then
  if redis.call('EXISTS', record) == 1 then
    return corrupt(0, 'the record has no status field')
  end
  return start(1)
end
if status == RELEASED then
  return start(1)  -- another attempt's tombstone: the call is free (its released tokens stay)
end
local attempt = attempt_of(f[5])
if status ~= 'pending' and status ~= 'unknown' and status ~= 'committed' then
  return corrupt(attempt, 'the record has an unknown status')
end
if not rkey or not rtool then
  return corrupt(attempt, 'the record has no key or tool field')
end
if not attempt then
  return corrupt(0, 'the record has a malformed attempt field')
end
if rkey ~= key or rtool ~= tool then
  return {'mismatch', attempt, false, false, rtool, rkey}
end
if status == 'committed' then
  if stored == '1' then
    return {'committed', attempt, value or '', mac or ''}
  end
  return {'committed', attempt}
end
if status == 'pending' and owner == token then
  redis.call('PEXPIRE', record, pending_ttl)  -- the write a WAIT after this re-send waits for
  return {'started', attempt}
end
if reversible then
  return start(attempt + 1)
end
return {status, attempt}
