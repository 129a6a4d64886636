import { describe, expect, it } from "vitest";
import { ApiError } from "./api";
import { AtlasFormatError, atlasFailure, atlasState, layers, parseAtlas, topAffinities, topics } from "./atlas";

const web = {
  categories: ["code", "math", "poetry"],
  experts: {
    "3:1": { affinity: { code: 0.98, math: 0.02 }, entropy: 0.14, top: "code", label: "specialist: code" },
    "3:2": { affinity: { code: 0.34, math: 0.33, poetry: 0.33 }, entropy: 1.58, top: "code", label: "generalist" },
    "4:0": { affinity: { poetry: 1 }, entropy: 0, top: "poetry", label: "specialist: poetry" },
    bogus: { affinity: {} },
  },
};

describe("atlas", () => {
  it("reads the dashboard (--web) shape", () => {
    const a = parseAtlas(web);
    expect(a.experts).toHaveLength(3);
    expect(a.layers).toEqual([3, 4]);
    const t = topics(a);
    expect(t.find((x) => x.topic === "code")?.owned).toBe(2);
    expect(t.find((x) => x.topic === "code")?.specialists.map((e) => e.expert)).toEqual([1]);
    expect(t.find((x) => x.topic === "math")?.owned).toBe(0);
  });

  it("reads the full (--out) record list with its spec", () => {
    const a = parseAtlas({
      categories: ["code", "math"],
      experts: [{ layer: 5, expert: 7, total: 90, spec: 0.8, top_topic: "math", top_lift: 1.9, reliability: "3/3", p: { code: 0.05, math: 0.95 } }],
    });
    expect(a.experts[0]).toMatchObject({ layer: 5, expert: 7, top: "math", specialist: true, spec: 0.8 });
  });

  it("summarises specialisation per layer", () => {
    const l = layers(parseAtlas(web));
    expect(l.map((x) => [x.layer, x.experts, x.specialists])).toEqual([[3, 2, 1], [4, 1, 1]]);
    expect(l[1]?.meanSpec).toBeCloseTo(1);
  });

  it("lists top affinities as percentages", () => {
    const e = parseAtlas(web).experts[0]!;
    expect(topAffinities(e)).toEqual([["code", 98], ["math", 2]]);
  });

  it("refuses a document without categories", () => {
    expect(() => parseAtlas({ experts: {} })).toThrow(AtlasFormatError);
    expect(() => parseAtlas("x")).toThrow(AtlasFormatError);
  });
});

describe("the Explore view's state", () => {
  it("reads colibri's empty state (no atlas written) as absent, with the server's words", () => {
    const message = "No expert atlas has been written on this server; colibri atlas analyze --web writes one.";
    expect(atlasState({ atlas: "absent", message })).toEqual({ kind: "absent", why: message });
    expect(atlasState({ atlas: "absent" })).toEqual({ kind: "absent", why: "This server has no expert atlas." });
  });

  it("reads an atlas as an atlas, and a body that is neither as an error", () => {
    const state = atlasState(web);
    expect(state.kind).toBe("ok");
    expect(state.kind === "ok" && state.atlas.experts).toHaveLength(3);
    expect(atlasState({ atlas: "present" })).toEqual({ kind: "error", message: "experts.json has no `categories` list" });
    expect(atlasState(null).kind).toBe("error");
  });

  it("another server's 404 and a refused key mean no atlas; other failures are errors; an abort is ignored", () => {
    expect(atlasFailure(new ApiError("Not found.", { status: 404 }))).toEqual({ kind: "absent", why: "GET /experts.json answered 404." });
    expect(atlasFailure(new ApiError("Invalid or missing API key.", { status: 401 }))).toEqual({ kind: "absent", why: "Invalid or missing API key." });
    expect(atlasFailure(new ApiError("offline", { kind: "network" }))).toEqual({ kind: "absent", why: "offline" });
    expect(atlasFailure(new ApiError("boom", { status: 500 }))).toEqual({ kind: "error", message: "boom" });
    expect(atlasFailure(new ApiError("Cancelled.", { kind: "aborted" }))).toBeNull();
  });
});
