-- common: what every transition shares. Prepended to each script when it is loaded (stores/scripts.py),
-- so each script below can use these names; it is not a script of its own.
--
-- A record is ONE Redis string (airlock_redis/stores/layout.py is its Python mirror):
--   a<status>,<attempt>,<begun>,<committed>,<stored>,<#owner>,<#key>,<#tool>,<#mac>,<#released>;
--   <owner><key><tool><mac><released><value>
-- "a" is the layout's version; status is one letter (p pending, c committed, u unknown, r released);
-- attempt, the two timestamps (ms since the epoch, empty when unknown) and the lengths are decimal;
-- stored is 1 when a committed value is kept. The byte fields follow in that order, the stored value
-- runs to the end. owner and key arrive packed by the Python side (raw bytes for the usual hex
-- tokens and keys), so the scripts only compare bytes. Only string.find and string.sub read it: no
-- cmsgpack, struct or bit, which fakeredis' Lua lacks.
--
-- A released record leaves a tombstone (status r, owner = the releasing token) for a short while. The
-- released list holds, while the key lives and whatever record is written there next, every token that
-- gave the record back, each as <length>:<bytes>: a request of such an attempt that arrives late (a
-- begin delayed in the network, a client's re-send) finds its token and writes nothing, and a re-sent
-- release or verdict finds it and answers "ok" again.
local RELEASED = 'released'
local STATUS_OF = {p = 'pending', c = 'committed', u = 'unknown', r = RELEASED}
local CODE_OF = {pending = 'p', committed = 'c', unknown = 'u', [RELEASED] = 'r'}
local HEADER = '^a(.),(%d+),(%d*),(%d*),([01]),(%d+),(%d+),(%d+),(%d+),(%d+);'
local OLD_LAYOUT = 'a record in the layout of an earlier airlock-redis release: resolve it with the CLI '
  .. 'or let it expire'
local MAX_TTL_MS = 315360000000  -- ten years; no script writes a record it cannot expire

-- Errors are raised as plain strings: Redis 6.2 cannot report a table raised with error().

-- A TTL argument in ms, checked before anything is written (a script that failed half-way would
-- leave a record with no TTL: Redis does not roll a script back).
local function ttl_arg(raw)
  local ms = tonumber(raw)
  if not ms or ms ~= ms or ms < 1 or ms > MAX_TTL_MS or ms % 1 ~= 0 then
    error('ERR airlock: TTL out of range (1 ms to ten years): ' .. tostring(raw))
  end
  return ms
end

-- A decimal argument (a time in ms, an attempt number), checked before anything is written: a record
-- written with anything else in its header would not parse.
local function digits_arg(raw, most)
  if type(raw) ~= 'string' or #raw > most or not string.find(raw, '^%d+$') then
    error('ERR airlock: not a decimal number of at most ' .. most .. ' digits: ' .. tostring(raw))
  end
  return raw
end

-- Is `token` in a released list? (The list was checked when its record was parsed.)
local function released_by(list, token)
  local at = 1
  while at <= #list do
    local colon = string.find(list, ':', at, true)
    local stop = colon + tonumber(string.sub(list, at, colon - 1))
    if string.sub(list, colon + 1, stop) == token then
      return true
    end
    at = stop + 1
  end
  return false
end

local function list_parses(list)
  local at = 1
  while at <= #list do
    local _, colon, length = string.find(list, '^(%d+):', at)
    if not colon or #length > 9 then
      return false
    end
    at = colon + tonumber(length) + 1
  end
  return at == #list + 1
end

-- The record a string holds, as a table, or nil and why it is not one.
local function parse(raw)
  local _, stop, code, attempt, begun, committed, stored, lo, lk, lt, lm, lr = string.find(raw, HEADER)
  if not stop then
    return nil, 'the record\'s header does not parse'
  end
  if not STATUS_OF[code] then
    return nil, 'the record has an unknown status'
  end
  if #attempt > 9 then
    return nil, 'the record has a malformed attempt'
  end
  if #begun > 15 or #committed > 15 then
    return nil, 'the record has a malformed timestamp'
  end
  if #lo > 9 or #lk > 9 or #lt > 9 or #lm > 9 or #lr > 9 then
    return nil, 'the record is cut short (its fields run past its end)'
  end
  local at = {stop + 1}
  for i, length in ipairs({lo, lk, lt, lm, lr}) do
    at[i + 1] = at[i] + tonumber(length)
  end
  if at[6] > #raw + 1 then
    return nil, 'the record is cut short (its fields run past its end)'
  end
  local released = string.sub(raw, at[5], at[6] - 1)
  if not list_parses(released) then
    return nil, 'the record\'s list of released tokens does not parse'
  end
  return {
    status = STATUS_OF[code], attempt = tonumber(attempt), begun = begun, committed = committed,
    stored = stored, owner = string.sub(raw, at[1], at[2] - 1), key = string.sub(raw, at[2], at[3] - 1),
    tool = string.sub(raw, at[3], at[4] - 1), mac = string.sub(raw, at[4], at[5] - 1),
    released = released, raw = raw, value_at = at[6],
  }
end

-- The stored value of a parsed record (read only when a reply needs it).
local function value_of(r)
  return r.value or string.sub(r.raw, r.value_at)
end

-- Set by the transitions that end a call (commit, settle, resolve); never by begin.
local ends_a_call = false

-- SET with a TTL. With maxmemory reached under noeviction, Redis refuses a script's FIRST write that
-- may grow memory, never one after a write (a script stays atomic). A transition that ends a call
-- replaces a record that is already there, so when its SET is refused for memory it deletes the
-- record and writes again: a release, a settle or a commit is never lost to OOM (the tool ran, or
-- certainly did not). A begin is refused as before, so no new call starts while memory is full.
local function set_px(record, body, ttl)
  if not ends_a_call then
    redis.call('SET', record, body, 'PX', ttl)
    return
  end
  local reply = redis.pcall('SET', record, body, 'PX', ttl)
  if type(reply) == 'table' and reply.err then
    if string.find(reply.err, 'OOM command not allowed', 1, true) then  -- 6.2 puts the line first
      redis.call('DEL', record)
    end
    redis.call('SET', record, body, 'PX', ttl)  -- any other refusal raises here, as before
  end
end

-- Write `r` over the key, with its TTL, in one command.
local function write(record, r, ttl)
  local body = table.concat({
    'a', CODE_OF[r.status], ',', r.attempt, ',', r.begun, ',', r.committed, ',', r.stored, ',',
    #r.owner, ',', #r.key, ',', #r.tool, ',', #r.mac, ',', #r.released, ';',
    r.owner, r.key, r.tool, r.mac, r.released, value_of(r),
  })
  set_px(record, body, ttl)
end

-- The common commit without parsing the record into a table: a pending record with no MAC, no released
-- list and no value (what a begin writes on a key that held nothing), owned by `token`, is rewritten
-- committed, byte for byte what `write` makes of it. Returns false, writing nothing, for any other
-- string: the caller then parses it and decides as for any record.
local PLAIN_PENDING = '^ap,(%d+),(%d*),,0,(%d+),(%d+),(%d+),0,0;'
local function commit_in_place(record, raw, token, stored, value, mac, now, ttl)
  local _, stop, attempt, begun, lo, lk, lt = string.find(raw, PLAIN_PENDING)
  if not stop or #attempt > 9 or #begun > 15 or #lo > 9 or #lk > 9 or #lt > 9 then
    return false
  end
  local owner_end = stop + tonumber(lo)
  if #raw ~= owner_end + tonumber(lk) + tonumber(lt) or string.sub(raw, stop + 1, owner_end) ~= token then
    return false
  end
  set_px(record, table.concat({
    'ac,', attempt, ',', begun, ',', now, ',', stored, ',', lo, ',', lk, ',', lt, ',', #mac, ',0;',
    string.sub(raw, stop + 1), mac, value,
  }), ttl)
  return true
end

-- A record of `status` for one attempt, carrying the released list of what the key held before.
local function fresh(status, key, tool, owner, attempt, released)
  return {
    status = status, attempt = attempt, begun = '', committed = '', stored = '0', owner = owner,
    key = key, tool = tool, mac = '', released = released or '', value = '',
  }
end

-- Replace the record by a tombstone of `token`, keeping the tokens released before.
local function bury(record, released, token, ttl)
  if not released_by(released, token) then
    released = released .. #token .. ':' .. token
  end
  write(record, fresh(RELEASED, '', '', token, 0, released), ttl)
end

-- A key that holds no string: a hash is a record of an earlier release (one field per item).
local function kind_of(record)
  return redis.call('TYPE', record)['ok']
end

-- An id (token or idempotency key) as the Python side packs it (layout.pack_id): `hex` lowercase hex
-- digits -> their bytes; any other text -> itself, with a NUL added when it is hex/2 bytes or longer.
local function pack_id(text, hex)
  if #text == hex and not string.find(text, '[^0-9a-f]') then
    return (string.gsub(text, '..', function(pair) return string.char(tonumber(pair, 16)) end))
  end
  if #text >= hex / 2 then
    return text .. '\0'
  end
  return text
end
