-- claim: a call that began its own record claims its idempotency key's index entry (dedupe; see
-- docs/design-in-doubt.md, section 5). The entry names one attempt of one tool_call_id; the record of
-- that id is the only authority on whether the key is busy (this script never reads a record: the
-- entry lives in the key's own slot).
-- KEYS[1]  the key's index entry
-- ARGV[1]  the claimer's entry: a,<#tool_call_id>,<#owner>;<tool_call_id><owner>
-- ARGV[2]  its TTL in ms (the pending TTL: an entry never outlives its claim's record for long)
-- ARGV[3]  the entry the claimer read and found stale ("" for none): a compare-and-set
-- Returns "claimed" (the entry now names the claimer: it was absent, the expected one, the claimer's
--                   own (a re-send), or another attempt of the same tool_call_id, whose record the
--                   claimer's begin took over),
--         {"held", entry}: another tool_call_id holds it; nothing was written.
local index = KEYS[1]
local mine, ttl, expected = ARGV[1], ttl_arg(ARGV[2]), ARGV[3]

local function holder_id(entry)
  local _, stop, lid = string.find(entry, '^a,(%d+),%d+;')
  if not stop or #lid > 9 then
    return nil
  end
  return string.sub(entry, stop + 1, stop + tonumber(lid))
end

local current = redis.call('GET', index)
if current and current ~= mine and current ~= expected and holder_id(current) ~= holder_id(mine) then
  return {'held', current}
end
redis.call('SET', index, mine, 'PX', ttl)
return 'claimed'
