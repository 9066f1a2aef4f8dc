-- begin: record a tool call pending for one attempt, or report what an earlier attempt left.
-- KEYS[1]  the call's record (a hash)
-- ARGV[1]  idempotency key of this call      ARGV[2]  tool name
-- ARGV[3]  owner token of this attempt        ARGV[4]  "1" when the tool is reversible, else "0"
-- ARGV[5]  pending TTL in ms                  ARGV[6]  now, ms since the epoch
-- Returns {outcome, attempt, value, mac, tool, key}; value, mac, tool and key only where noted:
--   {"started", n}                   this attempt owns the record (new, re-sent, or a reversible take-over)
--   {"committed", n, value, mac}     an earlier attempt committed; value is nil when it was not storable
--   {"pending", n} / {"unknown", n}  an earlier attempt is in doubt and the tool is not reversible
--   {"mismatch", n, nil, nil, tool, key}  the id belongs to another tool or other arguments
--   {"corrupt", n, nil, nil, why}    the hash is not a record (no status, key or tool, or an unknown status):
--                                    nothing is changed and the caller must not run the tool
-- Safe to re-send: the same token finds itself the owner and gets "started" again.
local record = KEYS[1]
local f = redis.call('HMGET', record, 'status', 'key', 'tool', 'owner', 'attempt', 'stored', 'value', 'mac')
local status = f[1]
if not status then
  if f[2] or f[3] or f[4] or f[5] or f[6] or f[7] or f[8] then
    return {'corrupt', 0, false, false, 'the record has no status field'}
  end
  redis.call('HSET', record, 'status', 'pending', 'key', ARGV[1], 'tool', ARGV[2], 'owner', ARGV[3],
    'attempt', 1, 'begun', ARGV[6])
  redis.call('PEXPIRE', record, ARGV[5])
  return {'started', 1}
end
local attempt = tonumber(f[5]) or 0
if status ~= 'pending' and status ~= 'unknown' and status ~= 'committed' then
  return {'corrupt', attempt, false, false, 'the record has an unknown status'}
end
if not f[2] or not f[3] then
  return {'corrupt', attempt, false, false, 'the record has no key or tool field'}
end
if f[2] ~= ARGV[1] or f[3] ~= ARGV[2] then
  return {'mismatch', attempt, false, false, f[3] or '', f[2] or ''}
end
if status == 'committed' then
  if f[6] == '1' then
    return {'committed', attempt, f[7] or '', f[8] or ''}
  end
  return {'committed', attempt}
end
if status == 'pending' and f[4] == ARGV[3] then
  return {'started', attempt}
end
if ARGV[4] == '1' and (status == 'pending' or status == 'unknown') then
  attempt = attempt + 1
  redis.call('HSET', record, 'status', 'pending', 'owner', ARGV[3], 'attempt', attempt, 'begun', ARGV[6])
  redis.call('PEXPIRE', record, ARGV[5])
  return {'started', attempt}
end
return {status, attempt}
