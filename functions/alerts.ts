import { defineFunction } from "../runtime/index.ts";
import { alertsConfig, alertsOf, postAlerts } from "./_lib/alerts.ts";

/**
 * docs/failing.md §5 (optional): raises every failing triple to Prometheus Alertmanager and resolves it on
 * recovery, sending the whole state again every 30 seconds. Off while `alerts.alertmanager`
 * is unset. It reads the follower's state, so Alertmanager being down never holds the follower.
 */
export default defineFunction({
  description: "Raises failing providers to Alertmanager (when alerts.alertmanager is set) and resolves them on recovery.",
  triggers: [{ cron: "*/30 * * * * *" }],
  config: alertsConfig,
  access: { views: ["failing"] },
  handler: async (_input, ctx) => {
    const { alertmanager } = ctx.config.alerts;
    if (alertmanager === undefined) return { sent: 0, off: "alerts.alertmanager is not set" };
    const alerts = alertsOf(await ctx.views.failing.records(">"), ctx.clock.now());
    if (alerts.length > 0) await postAlerts({ ...ctx.config.alerts, alertmanager }, alerts);
    return { sent: alerts.length, firing: alerts.filter((a) => a.endsAt === undefined).length };
  },
});
