-- resolve: an operator's verdict on a call, after asking the backend about its idempotency key, applied
-- only to the record the operator was shown.
-- KEYS[1]  the call's record
-- ARGV[1]  "committed", "unknown" or "release"    ARGV[2]  expected idempotency key, packed ("" to skip)
-- ARGV[3]  the verdict's owner token, packed (fences off any attempt still running; the same on a re-send)
-- ARGV[4]  "1" when a value is given             ARGV[5]  value bytes    ARGV[6]  mac bytes
-- ARGV[7]  TTL ms for the new status (release: the tombstone's)         ARGV[8]  now, ms since the epoch
-- ARGV[9]  expected status ("" to skip)           ARGV[10] expected owner token, packed ("" to skip)
-- Returns "ok" (done, or this verdict was already applied: a re-send), "missing" (no record),
--         "mismatch" (the record's key is not the expected one), "changed" (the record's status or
--         owner is not the one shown: it moved on, e.g. the tool committed, and nothing is changed),
--         {"newer", version} (a record of a newer layout: left as it is, for a host that reads it).
-- A damaged record is still a record here, so that an operator can resolve it: a string that does not
-- parse (its status, key and owner unknown: only a verdict without those checks applies). A key of
-- another Redis type is an error (WRONGTYPE), and nothing is changed.
ends_a_call = true
local record = KEYS[1]
local verdict, expect_key, operator = ARGV[1], ARGV[2], ARGV[3]
local expect_status, expect_owner = ARGV[9], ARGV[10]
local ttl = ttl_arg(ARGV[7])
local now = digits_arg(ARGV[8], 15)

local raw = redis.pcall('GET', record)
if not raw then
  return 'missing'
end
if type(raw) == 'table' then
  return raw  -- WRONGTYPE, or an ACL refusal: an error, and nothing is changed
end
local r, _, version = parse(raw)
if version then
  return {'newer', version}
end
r = r or {released = ''}  -- a string that does not parse: all unknown
if r.owner == operator or released_by(r.released, operator) then
  return 'ok'  -- this verdict, sent again: it was applied (a release, even if a retry began since)
end
if r.status == RELEASED then
  return 'missing'
end
if expect_key ~= '' and r.key ~= expect_key then
  return 'mismatch'
end
if (expect_status ~= '' and r.status ~= expect_status) or (expect_owner ~= '' and r.owner ~= expect_owner) then
  return 'changed'
end
if verdict == 'release' then
  bury(record, r.released, operator, ttl)
  wake(r, RELEASED)  -- the calls waiting for the attempt it fences off (common.lua)
  return 'ok'
end
r.owner, r.key, r.attempt = operator, r.key or '', r.attempt or 0
if verdict == 'committed' then
  r.status, r.stored, r.value, r.mac, r.committed = 'committed', ARGV[4] == '1' and '1' or '0', ARGV[5],
    ARGV[6], now
else
  r.status = 'unknown'
end
write(record, r, ttl)
wake(r, r.status)
return 'ok'
