-- common: what every transition shares. Prepended to each script when it is loaded (stores/scripts.py),
-- so each script below can use these names; it is not a script of its own.
--
-- A released record leaves a tombstone, {status = "released", owner = <token>, "released:<token>" = 1},
-- for a short while. The "released:<token>" fields stay on the key while it lives, whatever record is
-- written there next, one for every attempt (or verdict) that gave the record back: a request of such
-- an attempt that arrives late (a begin delayed in the network, a client's re-send) finds its field
-- and writes nothing, and a re-sent release or verdict finds it and answers "ok" again.
local RELEASED = 'released'
local RECORD_FIELDS = {'key', 'tool', 'attempt', 'begun', 'committed', 'stored', 'value', 'mac'}

local function released_field(token)
  return 'released:' .. token
end
local MAX_TTL_MS = 315360000000  -- ten years; no script writes a record it cannot expire

-- A TTL argument in ms, checked before anything is written (a script that failed half-way would
-- leave a record with no TTL: Redis does not roll a script back).
local function ttl_arg(raw)
  local ms = tonumber(raw)
  if not ms or ms ~= ms or ms < 1 or ms > MAX_TTL_MS or ms % 1 ~= 0 then
    error({err = 'ERR airlock: TTL out of range (1 ms to ten years): ' .. tostring(raw)})
  end
  return ms
end

-- The attempt field as a number, or nil when it is not a small decimal integer ("nan", "1e308", "-1").
local function attempt_of(raw)
  if type(raw) ~= 'string' or #raw > 9 or not string.match(raw, '^%d+$') then
    return nil
  end
  return tonumber(raw)
end

-- Replace the record by a tombstone of `token`, keeping the tokens released before.
local function bury(record, token, ttl)
  redis.call('HDEL', record, unpack(RECORD_FIELDS))
  redis.call('HSET', record, 'status', RELEASED, 'owner', token, released_field(token), '1')
  redis.call('PEXPIRE', record, ttl)
end

