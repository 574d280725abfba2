import { defineFunction } from "../runtime/index.ts";
import { answerPage, provisioningRequest, requestFilters, VERB } from "./_lib/provisioning.ts";

/** The verb of SPEC §4: read-only views of the registry and of what node clients recorded. */
export default defineFunction({
  description: "Answers mesh-provisioner.provisioning: the registry, needs, applied and collect, narrowed and paged.",
  triggers: [{ subject: VERB }, { http: "GET /provisioning" }],
  input: provisioningRequest,
  access: { reads: ["registry", "needs", "applied", "collect"] },
  handler: async (request, ctx) => {
    const reached = await ctx.buckets[request.what].list(requestFilters(request));
    return answerPage(request, reached, ctx.limits.maxPayload);
  },
});
