import { defineFunction } from "../runtime/index.ts";
import { checksOf } from "./_lib/checks.ts";
import {
  alertsConfig,
  alertsOf,
  CHECK_ALERTNAME,
  checkAlerts,
  heldAlerts,
  MODULE_ALERTNAME,
  moduleAlerts,
  NODE_ALERTNAME,
  nodeAlerts,
  postAlerts,
  raisedAlerts,
  STALE_ALERTNAME,
  staleAlerts,
  type PostableAlert,
} from "./_lib/alerts.ts";
import { nodesStatusOf, provisioningConfig, provisioningOf, readModel, staleHoldersOf, STATE_VIEWS } from "./_lib/state.ts";

// What this replica raised for modules, stale holders, unreachable nodes and failing checks at its
// last run, to resolve what no longer fires; what Alertmanager holds of them is asked at each run too
// (raised by an earlier process, or another replica).
let raisedModules = new Map<string, PostableAlert>();
const HELD = [MODULE_ALERTNAME, STALE_ALERTNAME, NODE_ALERTNAME, CHECK_ALERTNAME];

/**
 * docs/failing.md §5 (optional): raises every failing triple to Prometheus Alertmanager and
 * resolves it on recovery, every module that counts against the mesh (docs/state.md §7.6) and
 * every unreachable node and failing check (docs/presence.md §16.3, §16.5),
 * sending the whole state again every 30 seconds; what Alertmanager holds of these that no longer
 * fires is resolved, whoever raised it. Off while `alerts.alertmanager` is unset. It
 * reads the follower's state, so Alertmanager being down never holds the follower.
 */
export default defineFunction({
  description: "Raises failing providers and modules not well to Alertmanager (when alerts.alertmanager is set) and resolves them.",
  triggers: [{ cron: "*/30 * * * * *" }],
  config: alertsConfig.extend(provisioningConfig.shape),
  access: { views: STATE_VIEWS },
  handler: async (_input, ctx) => {
    const { alertmanager } = ctx.config.alerts;
    if (alertmanager === undefined) return { sent: 0, off: "alerts.alertmanager is not set" };
    const now = ctx.clock.now();
    const { graceSeconds } = ctx.config.provisioning;
    const { model } = await readModel(ctx);
    const firing = new Map([
      ...moduleAlerts(provisioningOf(model, now, graceSeconds).notWell, now),
      ...staleAlerts(staleHoldersOf(model, now), now),
      ...nodeAlerts(nodesStatusOf(model, now).unreachable, now),
      ...checkAlerts(checksOf(await ctx.views.checks.list(">")).checks, now),
    ]);
    const config = { ...ctx.config.alerts, alertmanager };
    const held = await heldAlerts(config, HELD).catch((err: Error) => {
      ctx.log.warn({ err: err.message }, "cannot list Alertmanager's alerts: resolving what this process raised only");
      return [];
    });
    const modules = raisedAlerts(firing, raisedModules, now, held);
    const alerts = [...alertsOf(await ctx.views.failing.records(">"), now), ...modules.alerts];
    if (alerts.length > 0) await postAlerts(config, alerts);
    raisedModules = modules.raised;
    return { sent: alerts.length, firing: alerts.filter((a) => a.endsAt === undefined).length };
  },
});
