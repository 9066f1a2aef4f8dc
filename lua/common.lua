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
-- tokens and keys), so the scripts only compare bytes.
--
-- A pending record held under a lease is written in layout "b", whose header has three more numbers
-- after stored:
--   b<status>,<attempt>,<begun>,<committed>,<stored>,<lease>,<ttl>,<waited>,<#owner>,<#key>,<#tool>,<#mac>,
--   <#released>;
-- lease: the ms its owner renews the record within; ttl: the PX it was last written with; waited: 1
-- once a call waits for this attempt to end (wait.lua), so that its end publishes (`wake`). The
-- record's own expiry is the lease: ms since the last renewal is ttl - PTTL, by the server's clock
-- (see `liveness`). Every other record (and a pending one without a lease) is written in layout "a",
-- so a release that reads only "a" refuses a leased pending record as newer and reads everything else. Only string.find and string.sub read it: no
-- cmsgpack, struct or bit, which fakeredis' Lua lacks. `parse` is the one reader and `write` the one
-- writer (commit.lua's shortcut for its common case writes what `write` would).
--
-- Versions: every layout begins with its version letter, then a lowercase letter (here the status),
-- then lowercase letters, digits and commas up to the first ';' (OTHER_VERSION). A string of that
-- shape with a letter other than "a" is a record of a newer airlock-redis: parse says so (and which
-- version), and no script writes over it (begin refuses the call, commit and settle answer
-- "superseded", resolve answers {"newer", version}). layout.py says why this rule.
--
-- A released record leaves a tombstone (status r, owner = the releasing token) for a short while. The
-- released list holds, while the key lives and whatever record is written there next, every token that
-- gave the record back, each as <length>:<bytes>: a request of such an attempt that arrives late (a
-- begin delayed in the network, a client's re-send) finds its token and writes nothing, and a re-sent
-- release or verdict finds it and answers "ok" again.
local RELEASED = 'released'
local STATUS_OF = {p = 'pending', c = 'committed', u = 'unknown', r = RELEASED}
local CODE_OF = {pending = 'p', committed = 'c', unknown = 'u', [RELEASED] = 'r'}
local VERSION = 'a'
local HEADER = '^' .. VERSION .. '(.),(%d+),(%d*),(%d*),([01]),(%d+),(%d+),(%d+),(%d+),(%d+);'
local LEASED_HEADER = '^b(.),(%d+),(%d*),(%d*),([01]),(%d+),(%d+),([01]),(%d+),(%d+),(%d+),(%d+),(%d+);'
local OTHER_VERSION = '^([c-z])[a-z][0-9a-z,]*;'
local NOT_A_STRING = 'the key holds another Redis type, not a string: not a record'
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

-- The record a string holds, as a table; or nil, why it is not one and, for a record of a newer
-- layout, its version letter.
local function parse(raw)
  local _, stop, code, attempt, begun, committed, stored, lo, lk, lt, lm, lr = string.find(raw, HEADER)
  local lease, ttl, waited
  if not stop and string.byte(raw, 1) == 98 then  -- "b": a pending record under a lease
    _, stop, code, attempt, begun, committed, stored, lease, ttl, waited, lo, lk, lt, lm, lr =
      string.find(raw, LEASED_HEADER)
    if stop and (code ~= 'p' or #lease > 15 or #ttl > 15) then
      return nil, 'the record has a malformed lease'
    end
  end
  if not stop then
    local version = string.match(raw, OTHER_VERSION)
    if version then
      return nil, 'the record was written by a newer airlock-redis (record layout version ' .. version .. ')',
        version
    end
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
  local k = stop + 1 + tonumber(lo)  -- where each field starts: owner at stop + 1, then key, tool, mac
  local t = k + tonumber(lk)
  local m = t + tonumber(lt)
  local l = m + tonumber(lm)
  local v = l + tonumber(lr)  -- the value
  if v > #raw + 1 then
    return nil, 'the record is cut short (its fields run past its end)'
  end
  local released = string.sub(raw, l, v - 1)
  if not list_parses(released) then
    return nil, 'the record\'s list of released tokens does not parse'
  end
  return {
    status = STATUS_OF[code], attempt = tonumber(attempt), begun = begun, committed = committed,
    stored = stored, owner = string.sub(raw, stop + 1, k - 1), key = string.sub(raw, k, t - 1),
    tool = string.sub(raw, t, m - 1), mac = string.sub(raw, m, l - 1),
    released = released, raw = raw, value_at = v, lease = lease, ttl = ttl, waited = waited,
  }
end

-- Is the pending record `r` (parsed from the key `record`) held by a live attempt? 'live' while its
-- owner renewed it within its lease, 'lapsed' after; nil when it cannot be told: no lease (layout a),
-- or a TTL changed by hand (PERSIST, EXPIRE), which is treated as a record without a lease. Also
-- answers the ms since the last renewal. The server's clock only: PTTL against the TTL it was written with.
local function liveness(record, r)
  if r.status ~= 'pending' or not r.lease then
    return nil
  end
  local pttl = redis.call('PTTL', record)
  local ttl = tonumber(r.ttl)
  if pttl < 0 or pttl > ttl then
    return nil
  end
  local since = ttl - pttl
  if since <= tonumber(r.lease) then
    return 'live', since
  end
  return 'lapsed', since
end

-- The stored value of a parsed record (read only when a reply needs it).
local function value_of(r)
  return r.value or (r.raw and string.sub(r.raw, r.value_at)) or ''
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

-- Write the record `r` (a table with the fields parse gives; an absent field is empty, an absent
-- attempt 0, an absent stored "0") over the key, with its TTL, in one command. The one writer.
-- `px` (a leased record only): expire in px ms, not ttl, so that its lease runs on as it was.
local function write(record, r, ttl, px)
  local owner, key, tool = r.owner or '', r.key or '', r.tool or ''
  local mac, released = r.mac or '', r.released or ''
  local version, lease = VERSION, ''
  if r.status == 'pending' and r.lease then  -- layout b: the lease, the TTL, whether anyone waits
    version, lease = 'b', r.lease .. ',' .. ttl .. ',' .. (r.waited or '0') .. ','
  end
  set_px(record, table.concat({
    version, CODE_OF[r.status], ',', r.attempt or 0, ',', r.begun or '', ',', r.committed or '', ',',
    r.stored or '0', ',', lease, #owner, ',', #key, ',', #tool, ',', #mac, ',', #released, ';',
    owner, key, tool, mac, released, value_of(r),
  }), px or ttl)
end

-- Wake the calls that wait for the running attempt of `r`, the record as it was before this
-- transition ended or handed it over: when one waits (wait.lua set its `waited` flag), publish the new
-- status on the channel named as the record's key (a channel, not a key: no second key, so no
-- cross-key rule of a Cluster's migrating slot applies). Nobody waiting: nothing is sent. PUBLISH through
-- pcall: a user whose ACL lacks the channel (Redis 7's default) must not turn a write that happened into
-- an error; its waiters then look again when their wait or the lease runs out.
local function wake(r, status)
  if r and r.waited == '1' then
    redis.pcall('PUBLISH', KEYS[1], status)
  end
end

-- Replace the record by a tombstone of `token`, keeping the tokens released before.
local function bury(record, released, token, ttl)
  if not released_by(released, token) then
    released = released .. #token .. ':' .. token
  end
  write(record, {status = RELEASED, owner = token, released = released}, ttl)
end
