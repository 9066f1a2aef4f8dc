-- unclaim: after its record's last write, an attempt that claimed its idempotency key's index entry
-- ends it (dedupe): deleted, or kept as long as its record lives. Fenced on the exact entry: an entry
-- another attempt claimed since is left alone.
-- KEYS[1]  the key's index entry
-- ARGV[1]  the attempt's entry (a,<#tool_call_id>,<#owner>;<tool_call_id><owner>)
-- ARGV[2]  the TTL to keep it for, in ms; "" deletes it
-- Returns 1 when the entry was the attempt's (and was changed), else 0.
local index = KEYS[1]
local mine, keep = ARGV[1], ARGV[2]
local ttl = keep ~= '' and ttl_arg(keep)

if redis.call('GET', index) ~= mine then
  return 0
end
if ttl then
  redis.call('PEXPIRE', index, ttl)
else
  redis.call('DEL', index)
end
return 1
