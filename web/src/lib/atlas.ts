/**
 * The expert atlas (`/experts.json`). Accepts both shapes colibri's analyze step writes:
 * the dashboard one (`--web`: experts keyed "layer:expert" with affinity, entropy in bits,
 * top, label) and the full one (`--out`: a list of records with layer, expert, spec,
 * top_topic, p).
 */
import { ApiError } from "./api";

export interface AtlasExpert {
  layer: number;
  expert: number;
  top: string;
  specialist: boolean;
  /** 1 − H(p)/log C: 0 generalist, 1 fires for one topic only. */
  spec: number;
  affinity: Record<string, number>;
}

export interface Atlas {
  categories: string[];
  experts: AtlasExpert[];
  layers: number[];
}

export interface TopicSummary {
  topic: string;
  specialists: AtlasExpert[];
  owned: number;
}

export interface LayerSummary {
  layer: number;
  meanSpec: number;
  specialists: number;
  experts: number;
}

export class AtlasFormatError extends Error {}

export const SPECIALIST_AT = 0.5;

function specFromAffinity(affinity: Record<string, number>, categories: number): number {
  if (categories < 2) return 0;
  let h = 0;
  for (const v of Object.values(affinity)) if (v > 0) h -= v * Math.log(v);
  return Math.max(0, 1 - h / Math.log(categories));
}

export function parseAtlas(doc: unknown): Atlas {
  if (doc === null || typeof doc !== "object") throw new AtlasFormatError("experts.json is not an object");
  const d = doc as Record<string, unknown>;
  if (!Array.isArray(d.categories) || !d.categories.every((c) => typeof c === "string")) {
    throw new AtlasFormatError("experts.json has no `categories` list");
  }
  const categories = d.categories as string[];
  const experts: AtlasExpert[] = [];
  if (Array.isArray(d.experts)) {
    for (const r of d.experts as Record<string, unknown>[]) {
      if (typeof r?.layer !== "number" || typeof r.expert !== "number") continue;
      const p = (r.p && typeof r.p === "object" ? r.p : {}) as Record<string, number>;
      const spec = typeof r.spec === "number" ? r.spec : specFromAffinity(p, categories.length);
      experts.push({
        layer: r.layer,
        expert: r.expert,
        top: typeof r.top_topic === "string" ? r.top_topic : "",
        specialist: spec >= SPECIALIST_AT,
        spec,
        affinity: p,
      });
    }
  } else if (d.experts && typeof d.experts === "object") {
    for (const [key, raw] of Object.entries(d.experts as Record<string, Record<string, unknown>>)) {
      const m = /^(\d+):(\d+)$/.exec(key);
      if (!m || raw === null || typeof raw !== "object") continue;
      const affinity = (raw.affinity && typeof raw.affinity === "object" ? raw.affinity : {}) as Record<string, number>;
      const label = typeof raw.label === "string" ? raw.label : "";
      experts.push({
        layer: Number(m[1]),
        expert: Number(m[2]),
        top: typeof raw.top === "string" ? raw.top : "",
        specialist: label.startsWith("specialist"),
        spec: specFromAffinity(affinity, categories.length),
        affinity,
      });
    }
  } else {
    throw new AtlasFormatError("experts.json has no `experts`");
  }
  const layers = [...new Set(experts.map((e) => e.layer))].sort((a, b) => a - b);
  return { categories, experts, layers };
}

export function topics(atlas: Atlas, perTopic = 5): TopicSummary[] {
  return atlas.categories.map((topic) => {
    const owned = atlas.experts.filter((e) => e.top === topic);
    const specialists = owned
      .filter((e) => e.specialist)
      .sort((a, b) => b.spec - a.spec || a.layer - b.layer || a.expert - b.expert);
    return { topic, owned: owned.length, specialists: specialists.slice(0, perTopic) };
  });
}

export function layers(atlas: Atlas): LayerSummary[] {
  return atlas.layers.map((layer) => {
    const xs = atlas.experts.filter((e) => e.layer === layer);
    return {
      layer,
      experts: xs.length,
      specialists: xs.filter((e) => e.specialist).length,
      meanSpec: xs.reduce((a, e) => a + e.spec, 0) / Math.max(1, xs.length),
    };
  });
}

/** Top affinities of an expert, as percentages, for the hover text. */
export function topAffinities(e: AtlasExpert, k = 3): [string, number][] {
  return Object.entries(e.affinity)
    .sort((a, b) => b[1] - a[1])
    .slice(0, k)
    .map(([c, v]) => [c, Math.round(v * 100)]);
}

/** What the Brain page's Explore view shows. */
export type AtlasState = { kind: "loading" } | { kind: "absent"; why: string } | { kind: "error"; message: string } | { kind: "ok"; atlas: Atlas };

/**
 * A `/experts.json` body as the Explore view's state. colibri answers
 * `{"atlas": "absent", "message": …}` while no atlas was written (spec/http.md §10): an empty
 * state, told apart from an atlas by its `atlas` key.
 */
export function atlasState(doc: unknown): AtlasState {
  if (doc !== null && typeof doc === "object" && (doc as { atlas?: unknown }).atlas === "absent") {
    const message = (doc as { message?: unknown }).message;
    return { kind: "absent", why: typeof message === "string" ? message : "This server has no expert atlas." };
  }
  try {
    return { kind: "ok", atlas: parseAtlas(doc) };
  } catch (e) {
    return { kind: "error", message: (e as Error).message };
  }
}

/**
 * A failed `/experts.json` read as the Explore view's state; null when the read was aborted.
 * Another server answers 404 (it has no such path) and a keyed one 401: both mean there is no
 * atlas to show, not an error.
 */
export function atlasFailure(e: unknown): AtlasState | null {
  if (e instanceof ApiError && e.kind === "aborted") return null;
  if (e instanceof ApiError && (e.status === 404 || e.status === 401 || e.kind === "network")) {
    return { kind: "absent", why: e.status === 404 ? "GET /experts.json answered 404." : e.message };
  }
  return { kind: "error", message: (e as Error).message };
}
