/**
 * Provisioning state (docs/state.md §7): for every module of every node, whether its provisioning
 * happened and why not, from the views of the assignments, needs, applied, registry, failing,
 * rotations and presence buckets. Every comparison is on the times the server stored the writes (`created`).
 *
 * The public face of `state/`, one job a file: `vocabulary.ts` (states, conditions, shapes,
 * schemas, config, the views read), `gather.ts` (records by module), `conditions.ts` (each
 * condition's one builder), `module.ts` (one module's state), `presence.ts` (nodes' presence), `keeper.ts` (the model kept up to
 * date), `current.ts` (the model of a `ctx` now), `reads.ts` (queries at a time asked). A file
 * here, not `state/index.ts`, so the build bundles it as an entry of its own (bin/build.mjs).
 */
export {
  CONDITIONS,
  conditionSchema,
  moduleStateSchema,
  NO_PROVISIONING,
  PRESENCES,
  provisioningConfig,
  provisioningSchema,
  NODE_VIEWS,
  STATE_VIEWS,
  STATES,
  type Condition,
  type ConditionType,
  type Model,
  type Modules,
  type ModuleState,
  type OutOfShapeKey,
  type Presence,
  type Provisioning,
  type State,
  type StateInputs,
  type StateView,
  type TrackedModule,
} from "./state/vocabulary.ts";
export { MAX_TEXT } from "./state/conditions.ts";
export { currentModel, modelOf } from "./state/keeper.ts";
export { readModel, snapshotsOf, type StateContext } from "./state/current.ts";
export {
  conditionsAt,
  countsAgainstAt,
  failingChecksOf,
  modulesOf,
  moduleStateAt,
  nodesAt,
  notWellCount,
  nodesStatusOf,
  provisioningOf,
  staleHoldersAt,
  staleHoldersOf,
  stateAt,
  unconfirmedChecksOf,
  type NodeEntry,
  type NodesStatus,
} from "./state/reads.ts";
