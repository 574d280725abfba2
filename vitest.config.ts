import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    testTimeout: 60_000,
    hookTimeout: 60_000,
    env: { LOG_LEVEL: "silent" },
    projects: [
      // The fast lane: what needs no nats-server (test/*.unit.test.ts), run first.
      { extends: true, test: { name: "unit", include: ["test/**/*.unit.test.ts"], sequence: { groupOrder: 0 } } },
      // Against real nats-servers, one per file: three files at once, whatever the cores (vitest's default is one less
      // than the cores, a single file on two): these tests mostly wait on servers and timers, not on the CPU.
      {
        extends: true,
        test: {
          name: "set",
          maxWorkers: 3,
          include: ["test/**/*.test.ts"],
          exclude: ["test/**/*.unit.test.ts", "test/cluster*.test.ts"],
          sequence: { groupOrder: 1 },
        },
      },
      // Clusters of three servers (test/cluster*.test.ts) with replicas 3 and replicas of the set: run once every other file is
      // done, one file at a time, so a cluster's timing is not the machine's load.
      {
        extends: true,
        test: { name: "cluster", include: ["test/cluster*.test.ts"], fileParallelism: false, sequence: { groupOrder: 2 } },
      },
    ],
  },
});
