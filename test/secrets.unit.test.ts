import { describe, expect, it } from "vitest";
import { redacted } from "../runtime/log.ts";
import { credentialOptions, withoutPassword } from "../runtime/session.ts";

describe("server URLs as shown", () => {
  it("hide whatever comes before the host, however the password is written", () => {
    expect(withoutPassword("nats://seat:S3cr3t@127.0.0.1:4222")).toBe("nats://***@127.0.0.1:4222");
    expect(withoutPassword("seat:S3cr3t@127.0.0.1:4222")).toBe("***@127.0.0.1:4222");
    expect(withoutPassword("nats://seat:p@ss@host:4222")).toBe("nats://***@host:4222");
    expect(withoutPassword("nats://seat:pa/ss@host:4222")).toBe("nats://***@host:4222");
    expect(withoutPassword("tls://sesame-token@host:4222")).toBe("tls://***@host:4222");
    expect(withoutPassword("nats://127.0.0.1:4222")).toBe("nats://127.0.0.1:4222");
  });

  it("give their credentials to the connection, as the nats CLI reads them", () => {
    const nats = (servers: string[]) => credentialOptions({ servers });
    expect(nats(["nats://seat:p%40ss@host:4222"])).toEqual({ user: "seat", pass: "p@ss" });
    expect(nats(["nats://seat:pa/ss@host:4222"])).toEqual({ user: "seat", pass: "pa/ss" });
    expect(nats(["nats://host:4222", "nats://sesame@host2:4222"])).toEqual({ token: "sesame" });
    expect(nats(["nats://host:4222"])).toEqual({});
    // Configured credentials come first.
    expect(credentialOptions({ servers: ["nats://a:b@host"], user: "seat", password: "pw" })).toEqual({ user: "seat", pass: "pw" });
  });
});

describe("logged objects", () => {
  it("have every credential field written ***, at any depth and in any case, errors included", () => {
    const err = Object.assign(new Error("boom"), {
      config: { nats: { password: "deep-secret" } },
      headers: { Authorization: "Bearer abc" },
    });
    const logged = redacted({ err, a: { b: { c: { d: { e: { PASSWORD: "x", Token: "y" } } } } }, list: [{ creds: "z" }], kept: "visible" });
    const text = JSON.stringify(logged);
    for (const secret of ["deep-secret", "Bearer abc", '"x"', '"y"', '"z"']) expect(text).not.toContain(secret);
    expect(logged).toMatchObject({
      err: { message: "boom", config: { nats: { password: "***" } }, headers: { Authorization: "***" } },
      kept: "visible",
    });
  });

  it("keep what is circular or very deep without failing", () => {
    const loop: Record<string, unknown> = { name: "loop" };
    loop.self = loop;
    expect(redacted(loop)).toEqual({ name: "loop", self: "[circular]" });
    let deep: Record<string, unknown> = { password: "p" };
    for (let i = 0; i < 20; i++) deep = { inner: deep };
    expect(JSON.stringify(redacted(deep))).toContain("[deep]");
  });
});
