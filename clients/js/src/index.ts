// @agui-fanout/client: the browser and Node side of an agui-fanout broker.

export {
  FanoutAgent,
  GAP_EVENT_NAME,
  type FanoutAgentConfig,
  type FanoutGap,
  type FanoutReset,
  type FanoutSubscriber,
} from "./agent.js";
export {
  FANOUT_METADATA_KEY,
  FollowError,
  ThreadFollower,
  isPreludeStart,
  type Batch,
  type ConnectionState,
  type FollowerOptions,
} from "./follow.js";
export { compareIds } from "./ids.js";
export { SseParser, readSse, type SseFrame, type SseItem } from "./sse.js";
export { jwtExpiryMs, type TokenSource } from "./token.js";
