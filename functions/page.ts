import { z } from "zod";
import { defineFunction, formatIssues, HtmlText, WithStatus } from "../runtime/index.ts";
import { EVENTS_STREAM } from "./_lib/follower.ts";
import { overviewOf, pageQuery } from "./_lib/overview.ts";
import { pageOf, PARTS_PATH, partsOf, refusedPage } from "./_lib/page/index.tsx";
import { provisioningConfig, STATE_VIEWS } from "./_lib/state.ts";

/**
 * docs/page.md §10: the page a person looks at, `GET /`: whether the mesh is well, what fails
 * and for how long, the grid of nodes × modules, a module's details, a triple's history, the
 * registry; and `GET /page.json`, its parts as HTML for its live script. A bad query is a 400
 * page naming the field.
 */
export default defineFunction({
  description: "Serves the page GET / (and its live parts, GET /page.json): status, failing, module states, history, the registry.",
  triggers: [{ http: "GET /" }, { http: `GET ${PARTS_PATH}` }],
  // Checked by the handler against pageQuery, so a refusal is a page, not JSON (taken as it
  // came: a record schema would drop a parameter named __proto__ before the check).
  input: z.unknown(),
  config: provisioningConfig,
  access: { views: STATE_VIEWS, streams: [EVENTS_STREAM] },
  handler: async (input, ctx) => {
    const parts = ctx.trigger.kind === "http" && ctx.trigger.path === PARTS_PATH;
    const query = pageQuery.safeParse(input);
    if (!query.success) {
      const message = formatIssues(query.error.issues);
      return new WithStatus(400, parts ? { error: { code: 400, message } } : new HtmlText(refusedPage(message)));
    }
    const overview = await overviewOf(ctx, query.data, EVENTS_STREAM);
    return parts ? { parts: partsOf(overview) } : new HtmlText(pageOf(overview));
  },
});
