/**
 * The import rules of the project (docs/runtime.md §6.10), checked by `npm test`:
 * functions reach the runtime through runtime/index.ts only; the runtime never reaches up into
 * functions, the command line or the demo; the command line reaches the runtime through
 * runtime/index.ts only; the client stands on the wire contract alone, and the contract on
 * nothing of the project; trigger kinds do not import each other; no cycles.
 */
module.exports = {
  forbidden: [
    {
      name: "functions-through-runtime-index",
      comment: "functions/ imports only runtime/index.ts, functions/_lib/, contract/ and libraries",
      severity: "error",
      from: { path: "^functions/" },
      to: { path: "^(runtime/(?!index\\.ts$)|cli/|demo/|test/)" },
    },
    {
      name: "runtime-below-its-users",
      comment: "runtime/ never imports functions/, cli/, demo/ or test/",
      severity: "error",
      from: { path: "^runtime/" },
      to: { path: "^(functions|cli|demo|test)/" },
    },
    {
      name: "cli-through-runtime-index",
      comment: "cli/ imports the runtime only through runtime/index.ts",
      severity: "error",
      from: { path: "^cli/" },
      to: { path: "^runtime/(?!index\\.ts$)" },
    },
    {
      name: "client-on-the-contract",
      comment: "client/ imports only client/, contract/ and libraries: a node's client carries no server",
      severity: "error",
      from: { path: "^client/" },
      to: { path: "^(runtime|functions|cli|demo|test|bin)/" },
    },
    {
      name: "contract-a-leaf",
      comment:
        "contract/ (subjects, event schemas, key codecs, times) imports nothing else of the project (and only zod: test/architecture.unit.test.ts)",
      severity: "error",
      from: { path: "^contract/" },
      to: { path: "^(runtime|functions|client|cli|demo|test|bin)/" },
    },
    {
      name: "trigger-kinds-apart",
      comment: "a trigger kind's file imports kind.ts, never another kind (only triggers/index.ts lists them)",
      severity: "error",
      from: { path: "^runtime/triggers/(?!index\\.ts$)[^/]+\\.ts$" },
      to: { path: "^runtime/triggers/(?!kind\\.ts$)" },
    },
    {
      name: "no-circular",
      comment: "no import cycles, type-only imports included",
      severity: "error",
      from: {},
      to: { circular: true },
    },
  ],
  options: {
    doNotFollow: { path: "node_modules" },
    exclude: { path: "^(node_modules|\\.state|test/bench/results)" },
    tsPreCompilationDeps: true,
    tsConfig: { fileName: "tsconfig.json" },
    enhancedResolveOptions: { extensions: [".ts", ".tsx", ".js", ".mjs"] },
  },
};
