-- Retention helpers of the append script (prepended to append.lua).
--
-- successor(id): the entry ID right after `id` (decimal string arithmetic, exact for every
--   u64 pair).
-- promote(stream, ckpt, pending): makes the pending checkpoint the thread's checkpoint and
--   trims every entry at or before it (`XTRIM … MINID <successor(pos)>`, exact).
-- pending_of(ckpt): the pending checkpoint {next_pos, next_events, next_ord}, or nil.
local function incr(s)
  local i = #s
  local zeros = ''
  while i > 0 do
    local d = string.byte(s, i) - 48
    if d < 9 then
      return string.sub(s, 1, i - 1) .. string.char(d + 49) .. zeros
    end
    zeros = zeros .. '0'
    i = i - 1
  end
  return '1' .. zeros
end
local function successor(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  if seq == '18446744073709551615' then
    return incr(ms) .. '-0'
  end
  return ms .. '-' .. incr(seq)
end
local function promote(stream, ckpt, pending)
  redis.call('HSET', ckpt, 'pos', pending[1], 'events', pending[2], 'ord', pending[3])
  redis.call('HDEL', ckpt, 'next_pos', 'next_events', 'next_ord')
  redis.call('XTRIM', stream, 'MINID', successor(pending[1]))
end
local function pending_of(ckpt)
  local p = redis.call('HMGET', ckpt, 'next_pos', 'next_events', 'next_ord')
  if p[1] and p[2] and p[3] and string.match(p[1], '^%d+-%d+$') then
    return p
  end
  return nil
end
