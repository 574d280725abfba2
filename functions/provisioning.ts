import { defineFunction } from "../runtime/index.ts";
import { ACCESS, answer, answerSchema, provisioningRequest, VERB } from "./_lib/provisioning.ts";
import { provisioningConfig } from "./_lib/state.ts";

/**
 * The verb of docs/verb.md §4: read-only views of the registry and of what node clients
 * recorded, the module states of docs/state.md §7, the holders and rotations of docs/rotation.md §8,
 * and the events' history of docs/failing.md §5.8; each `what` answered by its entry of the
 * table (functions/_lib/verb/whats.ts).
 */
export default defineFunction({
  description:
    "Answers mesh-provisioner.provisioning: the registry, needs, applied and collect, and each module's state, narrowed and paged.",
  triggers: [{ subject: VERB }, { http: "GET /provisioning" }],
  input: provisioningRequest,
  output: answerSchema,
  config: provisioningConfig,
  access: ACCESS,
  handler: answer,
});
