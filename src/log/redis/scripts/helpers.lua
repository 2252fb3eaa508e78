-- Helpers shared by every script (prepended to each; see scripts.rs).
--
-- renewed_ttl(ttl): the TTL the thread's keys get for an `idle_ttl` of `ttl` ms:
--   idle_ttl + min(idle_ttl / 16, 60 s).
-- ensure_epoch(stream, meta, ckpt, fresh, ttl): returns the thread's epoch, then whether the
--   stream exists. The epoch is created (from `fresh`) when it is missing or malformed, or
--   when the stream vanished after it existed under the current epoch. A new epoch clears the
--   meta hash (producer marks) and deletes the checkpoint hash; a created meta hash gets the
--   TTL for `ttl` ('0': none), so reads of threads nobody writes leave nothing behind for good.
-- stream_info(stream, ckpt, live): `XINFO STREAM`'s last-generated-id, max-deleted-entry-id,
--   recorded-first-entry-id, length and entries-added, then the checkpoint's pos and ord
--   ('0-0' and -1 without one); decoded by resp.rs (parse_head, max_deleted).
local function renewed_ttl(ttl)
  local t = tonumber(ttl)
  return t + math.min(math.floor(t / 16), 60000)
end
local function ensure_epoch(stream, meta, ckpt, fresh, ttl)
  local m = redis.call('HMGET', meta, 'epoch', 'seen')
  local ep, seen = m[1], m[2]
  local live = redis.call('EXISTS', stream) == 1
  if (not ep) or string.len(ep) ~= 8 or string.find(ep, '[^0-9a-f]') or (seen and not live) then
    ep = fresh
    -- A new epoch starts a new log: nothing of the old meta hash (producer marks) carries over.
    redis.call('DEL', meta)
    redis.call('HSET', meta, 'epoch', ep)
    if ttl ~= '0' then
      redis.call('PEXPIRE', meta, renewed_ttl(ttl))
    end
    redis.call('DEL', ckpt)
    seen = false
  end
  if live and not seen then
    redis.call('HSET', meta, 'seen', '1')
  end
  return ep, live
end
local function stream_info(stream, ckpt, live)
  if not live then
    return {'0-0', '0-0', '0-0', 0, 0, '0-0', -1}
  end
  local x = redis.call('XINFO', 'STREAM', stream)
  local f = {}
  for i = 1, #x, 2 do
    f[x[i]] = x[i + 1]
  end
  local info = {f['last-generated-id'], f['max-deleted-entry-id'], f['recorded-first-entry-id'],
    f['length'], f['entries-added']}
  for i = 1, 5 do
    if info[i] == nil then
      error('agui-fanout needs Redis 7.0 or newer (XINFO STREAM max-deleted-entry-id)')
    end
  end
  local c = redis.call('HMGET', ckpt, 'pos', 'ord')
  if c[1] and c[2] then
    info[6], info[7] = c[1], c[2]
  else
    info[6], info[7] = '0-0', -1
  end
  return info
end
