-- The append: compare (optional), XADD the batch, retention, producer mark, TTL, outcome
-- record, note. Built by `AppendArgs` (scripts.rs), the one place that writes this order.
--
-- KEYS[1] stream          `<prefix>:{<thread>}:log`
-- KEYS[2] meta            `<prefix>:{<thread>}:meta`
-- KEYS[3] ckpt            `<prefix>:{<thread>}:ckpt`
-- KEYS[4] outcome         `<prefix>:{<thread>}:o:<token>`, this append's own key (token: 32
--                         random hex digits drawn per append)
-- ARGV[1]  fresh epoch    8 hex digits, used if the thread needs a new epoch
-- ARGV[2]  maxlen         `XADD … MAXLEN ~` cap without checkpoints ('0': none)
-- ARGV[3]  safety cap     cap once the thread uses checkpoints ('0': none)
-- ARGV[4]  expected epoch ('' with ARGV[5] '': unconditional append)
-- ARGV[5]  expected last-generated-id
-- ARGV[6]  candidate gap  '-': no checkpoint candidate; else the candidate's least distance
--                         in entries (entries-added) from the pending checkpoint, below which
--                         it is dropped (AppendExtras::candidate_min_gap)
-- ARGV[7]  candidate      the checkpoint candidate's events (JSON array; '' without one)
-- ARGV[8]  max_age ms     ('0': none)
-- ARGV[9]  idle_ttl ms    ('0': none)
-- ARGV[10] producer id    ('': none)
-- ARGV[11] producer seq   number of the producer's last event in the batch (`p:<id>` in meta)
-- ARGV[12] note channel   ('': no note)
-- ARGV[13] thread id      (for the note)
-- ARGV[14] event types    the events' AG-UI types separated by spaces (for the note)
-- ARGV[15] record TTL ms  how long the outcome record lives
-- ARGV[16] publish        'PUBLISH' (a single Redis: one channel for every thread) or
--                         'SPUBLISH' (a cluster: ARGV[12] is the thread's own shard channel,
--                         in the slot of KEYS)
-- ARGV[17…] one compact JSON per event
--
-- Returns {epoch, {entry id…}}, or {'conflict', epoch, info} when the log's epoch or
-- last-generated-id is not the expected one (nothing appended, nothing changed), or
-- {'fenced'} when KEYS[4] is '-' (nothing appended, nothing changed): the broker lost this
-- call's reply and outcome.lua settled it as "not appended" before it ran, so it must never
-- append now; or {'done', record} when KEYS[4] holds this append's record (it ran before:
-- nothing appended again). An append records `<epoch> <entry id>…` at KEYS[4] for ARGV[15] ms, from which
-- outcome.lua answers a broker that lost the reply. The newest
-- entry's ID being the expected one is taken as a match (the only difference from the
-- last-generated-id: entries after it deleted with XDEL, which are then not in the log the
-- batch is checked against either).
-- idle_ttl renews the three keys' TTL only when the stream's is below it (or the checkpoint
-- hash may just have been created), to renewed_ttl(idle_ttl): a thread then expires between
-- idle_ttl and that long after its last append, and most appends make one PTTL call instead
-- of three PEXPIREs. A new stream has no TTL (below idle_ttl); a new meta hash got its TTL in
-- ensure_epoch.
-- After the XADDs, PUBLISHes the batch on ARGV[12] (format: notify.rs), with the stream's
-- last-generated-id before the batch: ARGV[5] when conditional (just compared), else from
-- XINFO STREAM ('0-0' for a stream that did not exist).
local done = redis.call('GET', KEYS[4])
if done then
  if done == '-' then
    return {'fenced'}
  end
  -- This very append already ran (a client repeated it after losing its reply: the cluster
  -- connection retries a call whose connection dropped): its record, nothing appended again.
  return {'done', done}
end
local ep, live = ensure_epoch(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[9])
local prev = ARGV[5]
if ARGV[4] ~= '' then
  -- The newest entry being the expected one is the common case, and `XREVRANGE … COUNT 1` is
  -- cheaper than `XINFO STREAM` (which also returns the first entry). Otherwise (another
  -- append came first, the stream is empty after trimming, or it went back to an older
  -- state: a restore, a replica that lagged) the last-generated-id decides. "Nothing after
  -- the expected ID" would not do: it also holds for a stream whose newest entry is older.
  local newest = nil
  if live and ep == ARGV[4] then
    local r = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
    if r[1] then
      newest = r[1][1]
    end
  end
  if newest ~= ARGV[5] then
    local info = stream_info(KEYS[1], KEYS[3], live)
    if ep ~= ARGV[4] or info[1] ~= ARGV[5] then
      return {'conflict', ep, info}
    end
  end
end
if #ARGV < 17 then
  return {ep, {}}
end
if ARGV[12] ~= '' and ARGV[4] == '' then
  prev = '0-0'
  if live then
    prev = stream_info(KEYS[1], KEYS[3], true)[1]
  end
end
if not live then
  redis.call('HSET', KEYS[2], 'seen', '1')
end
local candidate = ARGV[6] ~= '-'
local cap = ARGV[2]
-- With checkpoints in use, MAXLEN never trims: past the safety cap [3] the pending
-- checkpoint is promoted instead (below), so the fold stays rebuildable (PROTOCOL §6).
local in_use = candidate or redis.call('EXISTS', KEYS[3]) == 1
if in_use then
  cap = '0'
end
local ids = {}
for i = 17, #ARGV do
  if cap ~= '0' then
    ids[#ids + 1] = redis.call('XADD', KEYS[1], 'MAXLEN', '~', cap, '*', 'e', ARGV[i])
  else
    ids[#ids + 1] = redis.call('XADD', KEYS[1], '*', 'e', ARGV[i])
  end
end
-- `MAXLEN ~` removes whole stream nodes only: a Redis whose nodes are large (the
-- stream-node-max-entries / -bytes settings; 0 for both: one node) would trim nothing, and
-- the stream would grow without bound. Past twice the cap, trim exactly to the cap.
if cap ~= '0' and redis.call('XLEN', KEYS[1]) > 2 * tonumber(cap) then
  redis.call('XTRIM', KEYS[1], 'MAXLEN', cap)
end
if candidate then
  local older = pending_of(KEYS[3])
  local added = stream_info(KEYS[1], KEYS[3], true)[5]
  -- Dropped when it comes too soon after the pending one (another node's, usually).
  if not older or tonumber(added) - tonumber(older[3]) >= tonumber(ARGV[6]) then
    if older then
      promote(KEYS[1], KEYS[3], older)
    end
    redis.call('HSET', KEYS[3], 'next_pos', ids[#ids], 'next_events', ARGV[7], 'next_ord', added)
  end
end
if ARGV[8] ~= '0' then
  local pending = pending_of(KEYS[3])
  if pending then
    local t = redis.call('TIME')
    local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    local ms = tonumber(string.match(pending[1], '^(%d+)-'))
    if ms + tonumber(ARGV[8]) <= now_ms then
      promote(KEYS[1], KEYS[3], pending)
    end
  end
end
if in_use and ARGV[3] ~= '0' and redis.call('XLEN', KEYS[1]) > tonumber(ARGV[3]) then
  local pending = pending_of(KEYS[3])
  if pending then
    promote(KEYS[1], KEYS[3], pending)
  end
end
if ARGV[10] ~= '' then
  redis.call('HSET', KEYS[2], 'p:' .. ARGV[10], ARGV[11])
end
if ARGV[9] ~= '0' then
  -- `candidate` may have created the checkpoint hash: no TTL yet.
  if candidate or redis.call('PTTL', KEYS[1]) < tonumber(ARGV[9]) then
    local renewed = renewed_ttl(ARGV[9])
    for i = 1, 3 do
      redis.call('PEXPIRE', KEYS[i], renewed)
    end
  end
end
redis.call('SET', KEYS[4], ep .. ' ' .. table.concat(ids, ' '), 'PX', ARGV[15])
if ARGV[12] ~= '' then
  local note = {ARGV[13], ' ', ep, ' ', prev, '\n'}
  local i = 0
  for ty in string.gmatch(ARGV[14], '%S+') do
    i = i + 1
    local e = ARGV[16 + i]
    note[#note + 1] = ids[i] .. ' ' .. ty .. ' ' .. #e .. '\n'
    note[#note + 1] = e
  end
  if i == #ids then
    redis.call(ARGV[16], ARGV[12], table.concat(note))
  end
end
return {ep, ids}
