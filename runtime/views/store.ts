/**
 * The records of one load of a bucket, held compactly (docs/runtime.md §6.13): a B+ tree from
 * each key to a slot number, the slots' revisions, times and flags in typed arrays, and the
 * values' bytes in chunks of one arena. A record is made as an object only when it is read.
 * A value written over leaves its old bytes in the arena until there are more of them than of
 * live ones and 8 MiB, then the live values are copied into new chunks.
 */
import { createRequire } from "node:module";
import type { KeyRecord } from "../types.ts";

// Required, not imported: a CommonJS module whose default export tsx and vitest unwrap differently.
const { default: BTree } = createRequire(import.meta.url)("sorted-btree") as typeof import("sorted-btree");

/** The bytes of one arena chunk; a value longer than a quarter of it has a chunk of its own. */
export const CHUNK_BYTES = 1 << 20;
/** The arena is copied anew once its dead bytes pass its live ones and this many. */
export const DEAD_BYTES_KEPT = 8 << 20;

const DELETED = 1;
/** A delete marker whose value was not kept (the view reads it from the server when asked). */
const CUT = 2;
const EMPTY = new Uint8Array(0);
const byKey = (a: string, b: string) => (a < b ? -1 : a > b ? 1 : 0);

/** What one record is made of, as {@link RecordStore.set} takes it. */
export interface RecordParts {
  readonly key: string;
  readonly value: Uint8Array;
  /** The stream sequence of the write. */
  readonly revision: number;
  /** When the server stored it: milliseconds, and nanoseconds, since the epoch. */
  readonly createdMs: number;
  readonly createdNanos: number;
  readonly deleted: boolean;
  /** Whether `value` is dropped and the record marked cut (a long delete marker's value). */
  readonly cut: boolean;
}

const grown = <T extends Float64Array | Uint32Array | Uint8Array>(array: T, size: number, make: (n: number) => T): T => {
  const next = make(size);
  next.set(array);
  return next;
};

/**
 * One load's records by key: a key's record replaced in place, never removed. `chunkBytes` and
 * `deadBytesKept` default to {@link CHUNK_BYTES} and {@link DEAD_BYTES_KEPT} (smaller in tests).
 */
export class RecordStore {
  readonly #chunkBytes: number;
  readonly #deadBytesKept: number;
  readonly #slots = new BTree<string, number>(undefined, byKey, 128);
  #keys: string[] = [];
  #revision = new Float64Array(1024);
  #createdMs = new Float64Array(1024);
  #createdNanos = new Float64Array(1024);
  #chunk = new Uint32Array(1024);
  #offset = new Uint32Array(1024);
  #length = new Uint32Array(1024);
  #flags = new Uint8Array(1024);
  #chunks: Uint8Array[] = [];
  /** The chunk values are added to, and where the next one goes in it. */
  #current = -1;
  #fill = 0;
  #liveBytes = 0;
  #deadBytes = 0;

  constructor({ chunkBytes = CHUNK_BYTES, deadBytesKept = DEAD_BYTES_KEPT } = {}) {
    this.#chunkBytes = chunkBytes;
    this.#deadBytesKept = deadBytesKept;
  }

  /** The number of keys held, delete markers included. */
  get size(): number {
    return this.#keys.length;
  }

  /** The bytes the arena holds (live and dead) and those of live values, for the bench. */
  get bytes(): { arena: number; live: number } {
    return { arena: this.#chunks.reduce((n, c) => n + c.length, 0), live: this.#liveBytes };
  }

  /** The revision of the record `key` holds; `undefined` when it holds none. */
  revisionOf(key: string): number | undefined {
    const slot = this.#slots.get(key);
    return slot === undefined ? undefined : this.#revision[slot];
  }

  /** Holds `parts` as its key's record, the one before it dropped. */
  set(parts: RecordParts): void {
    let slot = this.#slots.get(parts.key);
    if (slot === undefined) {
      slot = this.#keys.length;
      if (slot === this.#revision.length) this.#grow();
      this.#keys.push(parts.key);
      this.#slots.set(parts.key, slot);
    } else {
      this.#drop(slot);
    }
    this.#revision[slot] = parts.revision;
    this.#createdMs[slot] = parts.createdMs;
    this.#createdNanos[slot] = parts.createdNanos;
    this.#flags[slot] = (parts.deleted ? DELETED : 0) | (parts.cut ? CUT : 0);
    this.#put(slot, parts.cut ? EMPTY : parts.value);
    if (this.#deadBytes > this.#deadBytesKept && this.#deadBytes > this.#liveBytes) this.#compact();
  }

  /** The slot of `key`; `undefined` when it was never written. */
  slotOf(key: string): number | undefined {
    return this.#slots.get(key);
  }

  /** The key of `slot`. */
  keyOf(slot: number): string {
    return this.#keys[slot]!;
  }

  /** Whether `slot` holds a delete marker. */
  deleted(slot: number): boolean {
    return (this.#flags[slot]! & DELETED) !== 0;
  }

  /** Whether `slot` holds a delete marker whose value was not kept. */
  cut(slot: number): boolean {
    return (this.#flags[slot]! & CUT) !== 0;
  }

  /** The record of `slot`, made anew: its value a copy of the arena's bytes (a Buffer, as nats.js reads give). */
  record(slot: number): KeyRecord {
    const length = this.#length[slot]!;
    const offset = this.#offset[slot]!;
    return {
      key: this.#keys[slot]!,
      value: length === 0 ? Buffer.alloc(0) : Buffer.from(this.#chunks[this.#chunk[slot]!]!.subarray(offset, offset + length)),
      revision: this.#revision[slot]!,
      created: new Date(this.#createdMs[slot]!),
      createdNanos: this.#createdNanos[slot]!,
      deleted: (this.#flags[slot]! & DELETED) !== 0,
    };
  }

  /** Every `[key, slot]` from `from` on, in key order. */
  entries(from: string): IterableIterator<[string, number]> {
    return this.#slots.entries(from);
  }

  #put(slot: number, value: Uint8Array): void {
    const length = value.length;
    this.#length[slot] = length;
    this.#liveBytes += length;
    if (length === 0) {
      this.#chunk[slot] = 0;
      this.#offset[slot] = 0;
    } else if (length > this.#chunkBytes / 4) {
      this.#chunk[slot] = this.#chunks.push(value.slice()) - 1;
      this.#offset[slot] = 0;
    } else {
      if (this.#current === -1 || this.#fill + length > this.#chunkBytes) {
        this.#current = this.#chunks.push(new Uint8Array(this.#chunkBytes)) - 1;
        this.#fill = 0;
      }
      this.#chunks[this.#current]!.set(value, this.#fill);
      this.#chunk[slot] = this.#current;
      this.#offset[slot] = this.#fill;
      this.#fill += length;
    }
  }

  /** Drops the value of `slot`: a chunk of its own at once, else its bytes counted dead. */
  #drop(slot: number): void {
    const length = this.#length[slot]!;
    this.#liveBytes -= length;
    if (length > this.#chunkBytes / 4) this.#chunks[this.#chunk[slot]!] = EMPTY;
    else this.#deadBytes += length;
  }

  #grow(): void {
    const size = Math.ceil(this.#revision.length * 1.5);
    this.#revision = grown(this.#revision, size, (n) => new Float64Array(n));
    this.#createdMs = grown(this.#createdMs, size, (n) => new Float64Array(n));
    this.#createdNanos = grown(this.#createdNanos, size, (n) => new Float64Array(n));
    this.#chunk = grown(this.#chunk, size, (n) => new Uint32Array(n));
    this.#offset = grown(this.#offset, size, (n) => new Uint32Array(n));
    this.#length = grown(this.#length, size, (n) => new Uint32Array(n));
    this.#flags = grown(this.#flags, size, (n) => new Uint8Array(n));
  }

  /** Copies every live value into new chunks, the dead bytes left behind. */
  #compact(): void {
    const old = this.#chunks;
    this.#chunks = [];
    this.#current = -1;
    this.#liveBytes = 0;
    this.#deadBytes = 0;
    const n = this.#keys.length;
    for (let slot = 0; slot < n; slot++) {
      const length = this.#length[slot]!;
      if (length === 0) continue;
      const offset = this.#offset[slot]!;
      this.#put(slot, old[this.#chunk[slot]!]!.subarray(offset, offset + length));
    }
  }
}
