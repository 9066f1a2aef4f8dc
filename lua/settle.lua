-- settle: the owner of a pending call that did not commit marks it unknown or releases it.
-- KEYS[1]  the call's record
-- ARGV[1]  owner token (packed)    ARGV[2]  "unknown" or "release"    ARGV[3]  unknown TTL ms
-- ARGV[4]  idempotency key (packed)    ARGV[5]  tool name    ARGV[6]  attempt number
-- ARGV[7]  tombstone TTL ms
-- Returns "ok" (done, or nothing left to do: a re-send), "superseded" (another owner, or the key holds a
--         string that is not a record of this layout: a damaged one, or one of a newer layout, which
--         stays as it is), "missing" (release: there was no record; a tombstone now keeps a late begin
--         of this attempt out), "recreated" (unknown: there was no record; the call is written again,
--         unknown). A key of another Redis type is an error (WRONGTYPE), as in commit.
-- Release leaves a tombstone of the token rather than nothing (see common.lua). Only a pending record
-- changes: a committed or unknown one is never released or marked here.
ends_a_call = true
local record = KEYS[1]
local token, settlement = ARGV[1], ARGV[2]
local unknown_ttl, tombstone_ttl = ttl_arg(ARGV[3]), ttl_arg(ARGV[7])

local raw = redis.call('GET', record)
local r = raw and parse(raw)
if r and r.status == RELEASED and released_by(r.released, token) then
  return 'ok'  -- this attempt released it already: a re-send
end
if not raw or (r and r.status == RELEASED and r.owner ~= token) then
  local released = r and r.released or ''
  if settlement == 'release' then
    bury(record, released, token, tombstone_ttl)
    return 'missing'
  end
  write(record, {status = 'unknown', key = ARGV[4], tool = ARGV[5], owner = token,
    attempt = digits_arg(ARGV[6], 9), released = released}, unknown_ttl)
  return 'recreated'
end
if not r or r.owner ~= token then
  return 'superseded'
end
if r.status == 'pending' then
  if settlement == 'release' then
    bury(record, r.released, token, tombstone_ttl)
    wake(r, RELEASED)  -- the calls waiting for this attempt (common.lua)
  else
    r.status = 'unknown'
    write(record, r, unknown_ttl)
    wake(r, 'unknown')
  end
end
return 'ok'
