// The console's entry into the client package (clients/js, built by `npm run build`): what the
// customer view uses, bundled with @ag-ui/client and rxjs into assets/fanout-client.js.
export { FanoutAgent } from "../../clients/js/dist/index.js";
