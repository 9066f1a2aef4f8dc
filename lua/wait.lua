-- wait: a call that found its record held by a running attempt asks to be woken when that attempt
-- ends: the record's `waited` flag is set (layout b, common.lua), and the transition that ends it
-- publishes on the channel named as the record's key (common.lua, wake).
-- KEYS[1]  the call's record
-- Returns {"waiting", lease_left_ms}: the attempt still runs (its lease is live) and the flag is set;
--                                    lease_left_ms: when, unrenewed, the lease would lapse (the waiter
--                                    looks again then: no end comes from an attempt that died)
--         {"changed"}:               anything else (the attempt ended, its lease lapsed, no record):
--                                    the waiter begins again now, without waiting.
-- Sent after the waiter subscribed to the channel: an end after this script publishes to a channel
-- already listened to, and an end before it is seen here. Setting the flag rewrites the record with
-- the TTL it has left, so its lease runs on unchanged.
local record = KEYS[1]

local raw = redis.call('GET', record)
local r = raw and parse(raw)
if not r or r.status ~= 'pending' then
  return {'changed'}
end
local live, since = liveness(record, r)
if live ~= 'live' then
  return {'changed'}
end
if r.waited ~= '1' then
  r.waited = '1'
  write(record, r, tonumber(r.ttl), tonumber(r.ttl) - since)
end
return {'waiting', tonumber(r.lease) - since}
