-- renew: the owner of a running call renews its lease (see common.lua, layout b).
-- KEYS[1]  the call's record
-- ARGV[1]  owner token (packed)
-- Returns "ok" (the record is this attempt's, pending: its TTL, and so its lease, starts again),
--         "superseded" (another attempt or an operator owns the record, or it ended: committed,
--                     unknown or released; or the key holds no record of a layout this reads),
--         "missing" (no record).
-- Changes only the TTL of a pending record the token owns: a renewal that lands late (after the
-- commit, a take-over or an operator's verdict) changes nothing. A lapsed lease is renewed as long as
-- the record is still this attempt's: an owner cut off for a while picks its lease up again.
local record = KEYS[1]
local token = ARGV[1]

local raw = redis.call('GET', record)
if not raw then
  return 'missing'
end
local r = parse(raw)
if not r or r.status ~= 'pending' or r.owner ~= token or not r.lease then
  return 'superseded'
end
redis.call('PEXPIRE', record, r.ttl)
return 'ok'
