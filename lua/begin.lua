-- begin: record a tool call pending for one attempt, or report what an earlier attempt left.
-- KEYS[1]  the call's record (a string: see common.lua)
-- ARGV[1]  idempotency key of this call (packed)  ARGV[2]  tool name
-- ARGV[3]  owner token of this attempt (packed)   ARGV[4]  "1" when the tool is reversible, else "0"
-- ARGV[5]  pending TTL in ms                      ARGV[6]  now, ms since the epoch
-- ARGV[7]  the lease of this attempt in ms ("" or absent: none; see common.lua, layout b)
-- ARGV[8]  "1" when the tool (not reversible) has a probe: a record in doubt is taken for this attempt
--          to ask it, answered {"probe", n, found}
-- Returns {outcome, attempt, value, mac, tool, key}; value, mac, tool and key only where noted:
--   {"started", n}                   this attempt owns the record (new, re-sent, or a reversible take-over)
--   {"committed", n, value, mac}     an earlier attempt committed; value is absent when it was not storable
--   {"running", n, lease, since}     an earlier attempt holds the record under a lease it renewed `since`
--                                    ms ago (server clock): it runs; whatever the tool, it does not run
--                                    a second time beside it
--   {"abandoned", n, lease, since}   an earlier attempt's lease lapsed (gone or hung): in doubt, and the
--                                    tool is not reversible (a reversible one takes the record over)
--   {"pending", n} / {"unknown", n}  an earlier attempt is in doubt (pending: no lease to tell whether
--                                    it runs) and the tool is not reversible
--   {"probe", n, found}              unknown or abandoned (found), and the tool has a probe: this attempt
--                                    now owns the record (attempt n, pending under its lease) and asks
--                                    the probe before its tool may run; others wait for it meanwhile
--   {"mismatch", n, false, false, tool, key}  the id belongs to another tool or other arguments
--   {"corrupt", n, false, false, why}  the key holds no well-formed record (another Redis type, or a
--                                    string that does not parse): nothing is changed and the caller
--                                    must not run the tool
--   {"corrupt", 0, false, false, why, version}  a record of a newer layout (version: its letter):
--                                    likewise, and the caller says to upgrade
--   {"released", 0}                  this attempt already gave the record back (a begin that arrived
--                                    late, whatever the key holds now): nothing is written
-- Safe to re-send: the same token finds itself the owner, answers "started" again, and writes again so
-- that a WAIT sent after it on the same connection covers the record (Redis 7.2+ counts only the
-- connection's own writes). Replies use false, not nil, for absent items: a nil would end the array.
local record = KEYS[1]
local key, tool, token, reversible = ARGV[1], ARGV[2], ARGV[3], ARGV[4] == '1'
local pending_ttl = ttl_arg(ARGV[5])
local now = digits_arg(ARGV[6], 15)
local lease, probes = ARGV[7], ARGV[8] == '1'
if lease == '' then
  lease = nil
elseif lease then
  ttl_arg(lease)
end

-- Write this attempt's pending record over what the key holds: `before`, the record there (nil for none).
-- Its released list stays, and so do a value, mac and commit time an operator's verdict left on it.
local function start(attempt, before)
  local r = {status = 'pending', key = key, tool = tool, owner = token, attempt = attempt, begun = now,
    lease = lease}
  if before then
    r.released, r.stored, r.value, r.mac, r.committed = before.released, before.stored, value_of(before),
      before.mac, before.committed
  end
  write(record, r, pending_ttl)
  return {'started', attempt}
end

local raw = redis.pcall('GET', record)
if not raw then
  return start(1, nil)
end
if type(raw) == 'table' then
  if string.find(tostring(raw.err), 'WRONGTYPE', 1, true) then
    return {'corrupt', 0, false, false, NOT_A_STRING}
  end
  return raw  -- any other error (an ACL refusal): as it is
end
local r, why, version = parse(raw)
if not r then
  return {'corrupt', 0, false, false, why, version}
end
if released_by(r.released, token) then
  return {'released', 0}
end
if r.status == RELEASED then
  return start(1, r)  -- another attempt's tombstone: the call is free (its released tokens stay)
end
local attempt = r.attempt
if r.key ~= key or r.tool ~= tool then
  return {'mismatch', attempt, false, false, r.tool, r.key}
end
if r.status == 'committed' then
  if r.stored == '1' then
    return {'committed', attempt, value_of(r), r.mac}
  end
  return {'committed', attempt}
end
if r.status == 'pending' and r.owner == token then
  redis.call('PEXPIRE', record, r.ttl or pending_ttl)  -- the write a WAIT after this re-send waits for
  return {'started', attempt}
end
local live, since = liveness(record, r)
if live == 'live' then
  return {'running', attempt, tonumber(r.lease), since}
end
if reversible then
  return start(attempt + 1, r)
end
if probes and (r.status == 'unknown' or live == 'lapsed') then
  start(attempt + 1, r)
  return {'probe', attempt + 1, r.status == 'unknown' and 'unknown' or 'abandoned'}
end
if live == 'lapsed' then
  return {'abandoned', attempt, tonumber(r.lease), since}
end
return {r.status, attempt}
