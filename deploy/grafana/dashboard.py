"""Writes deploy/grafana/agui-fanout.json, the agui-fanout dashboard (run from the repository root:
`python3 deploy/grafana/dashboard.py`). Edit the panels here, not in the JSON. Metric names: PROTOCOL §9;
tests/metrics_families.rs checks that each one exists on a fresh broker."""
import json
SEL='job=~"$job", instance=~"$instance"'
panels=[]; pid=[0]; y=[0]
def nid():
    pid[0]+=1; return pid[0]
def row(title):
    panels.append({"id":nid(),"type":"row","title":title,"collapsed":False,"gridPos":{"h":1,"w":24,"x":0,"y":y[0]},"panels":[]})
    y[0]+=1
x=[0]
def ts(title, desc, targets, unit="short", w=8, stack=False):
    if x[0]+w>24: x[0]=0; y[0]+=8
    p={"id":nid(),"type":"timeseries","title":title,"description":desc,
       "datasource":{"type":"prometheus","uid":"${datasource}"},
       "gridPos":{"h":8,"w":w,"x":x[0],"y":y[0]},
       "fieldConfig":{"defaults":{"unit":unit,"custom":{"drawStyle":"line","lineWidth":1,"fillOpacity":10 if stack else 0,
           "stacking":{"mode":"normal" if stack else "none","group":"A"}}},"overrides":[]},
       "options":{"legend":{"displayMode":"list","placement":"bottom","showLegend":True},"tooltip":{"mode":"multi","sort":"desc"}},
       "targets":[{"datasource":{"type":"prometheus","uid":"${datasource}"},"refId":chr(65+i),"expr":e,"legendFormat":l} for i,(e,l) in enumerate(targets)]}
    panels.append(p); x[0]+=w
def endrow():
    x[0]=0; y[0]+=8
def q(qs, m, by="le"):
    return [(f'histogram_quantile({q}, sum by ({by}) (rate({m}_bucket{{{SEL}}}[$__rate_interval])))', f'p{int(q*100)}') for q in qs]

row("Traffic")
ts("Events published /s, by type","Events appended to thread logs through this broker's publish endpoints (agui_events_published_total).",
   [(f'sum by (type) (rate(agui_events_published_total{{{SEL}}}[$__rate_interval]))',"{{type}}")],"ops",stack=True)
ts("Events delivered /s, by type","Live events handed to subscribers' queues (one per subscriber; backfills and preludes not counted; agui_events_delivered_total).",
   [(f'sum by (type) (rate(agui_events_delivered_total{{{SEL}}}[$__rate_interval]))',"{{type}}")],"ops",stack=True)
ts("Open SSE connections, by pod","agui_connections: the HPA's custom metric (target per pod in hpa.yaml). Uneven pods after a scale-out even out as streams reach sse.max_stream_age.",
   [(f'sum by (instance) (agui_connections{{{SEL}}})',"{{instance}}"),(f'sum(agui_connections{{{SEL}}})',"total")])
endrow()
ts("Publishes refused /s, by reason","agui_events_rejected_total: invalid events, order violations, bodies too large, backend unavailable.",
   [(f'sum by (reason) (rate(agui_events_rejected_total{{{SEL}}}[$__rate_interval]))',"{{reason}}")],"ops")
ts("Resumes /s, by outcome","agui_resumes_total: exact (Last-Event-ID resumed) or prelude (not resumable: a reset to the head).",
   [(f'sum by (outcome) (rate(agui_resumes_total{{{SEL}}}[$__rate_interval]))',"{{outcome}}")],"ops")
ts("Runs closed as orphaned /s","agui_runs_orphaned_total: runs the broker ended with RUN_ERROR (orphaned) after runs.orphan_timeout without an event.",
   [(f'sum(rate(agui_runs_orphaned_total{{{SEL}}}[$__rate_interval]))',"orphaned")],"ops")
endrow()
row("Run gateway")
ts("Gateway runs ended /s, by outcome","agui_runs_ended_total: runs of POST /v1/agents/{name} by outcome (finished, interrupted, error, failed, cancelled, shutdown, abandoned; PROTOCOL §11).",
   [(f'sum by (outcome) (rate(agui_runs_ended_total{{{SEL}}}[$__rate_interval]))',"{{outcome}}"),
    (f'sum(rate(agui_runs_started_total{{{SEL}}}[$__rate_interval]))',"started")],"ops")
ts("Runs active; upstream errors /s, by cause","agui_runs_active (per pod) and agui_upstream_errors_total (runs ended by an agent failure, by RUN_ERROR code).",
   [(f'sum by (instance) (agui_runs_active{{{SEL}}})',"active {{instance}}"),
    (f'sum by (cause) (rate(agui_upstream_errors_total{{{SEL}}}[$__rate_interval]))',"{{cause}} /s")])
ts("Gateway run duration","agui_run_duration_seconds: from a run's request to its terminal event.",
   q([0.5,0.9,0.99],"agui_run_duration_seconds"),"s")
endrow()
row("Latency")
ts("Read → write latency (publish to subscriber socket)","agui_publish_to_write_seconds: from the node reading an event off the log to its frame written to the subscriber's socket. Alert: AguiFanoutPublishToWriteSlow (p99 > 0.5 s).",
   q([0.5,0.9,0.99],"agui_publish_to_write_seconds"),"s")
ts("Tail lag (append → node read)","agui_append_to_read_seconds: from Redis assigning the entry id to the node's fan-out reading it (includes clock skew between Redis and the node). Alert: AguiFanoutTailLagging (p99 > 5 s).",
   q([0.5,0.99],"agui_append_to_read_seconds"),"s")
ts("Redis latency p99, by operation","agui_backend_latency_seconds.",
   [(f'histogram_quantile(0.99, sum by (op, le) (rate(agui_backend_latency_seconds_bucket{{{SEL}}}[$__rate_interval])))',"{{op}}")],"s")
endrow()
row("Slow consumers and resets")
ts("Events coalesced /s, by type","agui_events_coalesced_total: pending events merged for subscribers that read slower than events arrive (the first step of the slow-consumer policy).",
   [(f'sum by (type) (rate(agui_events_coalesced_total{{{SEL}}}[$__rate_interval]))',"{{type}}")],"ops",stack=True)
ts("Resets /s, by cause","agui_resets_total: subscribers reset to a snapshot. overflow: too slow; trimmed: behind retention; epoch/ahead: the log lost data (alert AguiFanoutLogLostData); invalid/unknown/bridge: unresumable Last-Event-ID.",
   [(f'sum by (cause) (rate(agui_resets_total{{{SEL}}}[$__rate_interval]))',"{{cause}}")],"ops",stack=True)
ts("Disconnects /s, by cause","agui_disconnects_total: streams the broker ended (overflow without a bridge, discontinuity, backend, write_timeout, token_expired).",
   [(f'sum by (cause) (rate(agui_disconnects_total{{{SEL}}}[$__rate_interval]))',"{{cause}}")],"ops",stack=True)
endrow()
ts("Queue depth (events pending in connection queues)","agui_queue_depth_events, per pod.",
   [(f'sum by (instance) (agui_queue_depth_events{{{SEL}}})',"{{instance}}")])
ts("Stalled subscribers (reset, not reading)","agui_resets_pending: connections reset whose writer has not come back for its bridge.",
   [(f'sum by (instance) (agui_resets_pending{{{SEL}}})',"{{instance}}")])
ts("CUSTOM/RAW events dropped by resets /s","agui_events_skipped_total: told to the client by the gap event.",
   [(f'sum by (type) (rate(agui_events_skipped_total{{{SEL}}}[$__rate_interval]))',"{{type}}")],"ops")
endrow()
row("Log backend")
ts("Redis errors /s, by operation","agui_backend_errors_total. op=tail: the node's tail (a stall that lasts: alert AguiFanoutTailStalled, on agui_redis_tail_stalled); others: AguiFanoutBackendErrors.",
   [(f'sum by (op) (rate(agui_backend_errors_total{{{SEL}}}[$__rate_interval]))',"{{op}}")],"ops",stack=True)
ts("Backend up, by pod","agui_backend_up: 1 while Redis answers (readiness). Alert: AguiFanoutNotReady.",
   [(f'min by (instance) (agui_backend_up{{{SEL}}})',"{{instance}}")])
ts("Unknown append outcomes settled /s; invalid log entries /s","agui_append_outcomes_settled_total (appends whose reply was lost, by what settling found) and agui_log_invalid_entries_total.",
   [(f'sum by (outcome) (rate(agui_append_outcomes_settled_total{{{SEL}}}[$__rate_interval]))',"settled {{outcome}}"),
    (f'sum(rate(agui_log_invalid_entries_total{{{SEL}}}[$__rate_interval]))',"invalid entries")],"ops")
endrow()
row("Process")
ts("CPU, by pod","process_cpu_seconds_total (whole seconds: read over at least a minute).",
   [(f'sum by (instance) (rate(process_cpu_seconds_total{{{SEL}}}[$__rate_interval]))',"{{instance}}")],"percentunit")
ts("Resident memory, by pod; per connection","process_resident_memory_bytes, and divided by open connections (sizing the HPA's connections target against the memory limit).",
   [(f'sum by (instance) (process_resident_memory_bytes{{{SEL}}})',"{{instance}}"),
    (f'sum(process_resident_memory_bytes{{{SEL}}}) / clamp_min(sum(agui_connections{{{SEL}}}), 1)',"per connection")],"bytes")
ts("Open file descriptors / limit, by pod","process_open_fds / process_max_fds: each SSE connection holds one. Alert: AguiFanoutFileDescriptorsNearLimit (> 80 %).",
   [(f'max by (instance) (process_open_fds{{{SEL}}} / (process_max_fds{{{SEL}}} > 0))',"{{instance}}")],"percentunit")
endrow()
ts("Versions running","agui_build_info: pods per version (two during a rollout).",
   [(f'count by (version) (agui_build_info{{{SEL}}})',"{{version}}")],"short",w=24)

dash={"uid":"agui-fanout","title":"agui-fanout","description":"AG-UI SSE fan-out broker: traffic, latency, slow consumers, Redis, process. Metrics: PROTOCOL §9; alerts: deploy/prometheus/agui-fanout.rules.yml.",
 "tags":["agui-fanout"],"timezone":"browser","editable":True,"graphTooltip":1,"schemaVersion":39,"version":1,"refresh":"30s",
 "time":{"from":"now-3h","to":"now"},
 "templating":{"list":[
   {"name":"datasource","label":"Data source","type":"datasource","query":"prometheus","current":{},"hide":0},
   {"name":"job","label":"Job","type":"query","datasource":{"type":"prometheus","uid":"${datasource}"},
    "query":{"query":"label_values(agui_build_info, job)","refId":"job"},"definition":"label_values(agui_build_info, job)",
    "refresh":2,"includeAll":True,"multi":True,"current":{"text":"All","value":"$__all"},"allValue":".*","hide":0},
   {"name":"instance","label":"Pod","type":"query","datasource":{"type":"prometheus","uid":"${datasource}"},
    "query":{"query":"label_values(agui_build_info{job=~\"$job\"}, instance)","refId":"instance"},"definition":"label_values(agui_build_info{job=~\"$job\"}, instance)",
    "refresh":2,"includeAll":True,"multi":True,"current":{"text":"All","value":"$__all"},"allValue":".*","hide":0}]},
 "annotations":{"list":[]},
 "panels":panels}
open("deploy/grafana/agui-fanout.json","w").write(json.dumps(dash,indent=2)+"\n")

