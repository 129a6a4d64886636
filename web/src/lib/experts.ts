/**
 * `/experts` decoding (colibri's live routing map) and the Brain grid's colours.
 * map: 2 hex chars per expert, row-major, byte = tier << 6 | heat (tier 0 disk, 1 RAM,
 * 2 VRAM; heat a 6-bit log2 bucket). hits: a hex bitmap, expert i at byte i >> 3, bit i & 7.
 */

export interface ExpertsBody {
  rows: number;
  cols: number;
  map: string;
  hits: string;
  seq: number;
}

export const TIER_NAMES = ["disk", "RAM", "VRAM"] as const;
export const TIER_COLOURS: readonly (readonly [number, number, number])[] = [
  [58, 71, 80],
  [90, 155, 216],
  [78, 214, 165],
];

export interface ExpertGrid {
  rows: number;
  cols: number;
  tier: Uint8Array;
  heat: Uint8Array;
}

export class ExpertsFormatError extends Error {}

function hexByte(text: string, at: number): number {
  const v = parseInt(text.substr(at, 2), 16);
  if (Number.isNaN(v) || !/^[0-9a-fA-F]{2}$/.test(text.substr(at, 2))) {
    throw new ExpertsFormatError(`bad hex at ${at}`);
  }
  return v;
}

export function decodeMap(body: ExpertsBody): ExpertGrid {
  const { rows, cols, map } = body;
  if (!Number.isInteger(rows) || !Number.isInteger(cols) || rows < 0 || cols < 0) {
    throw new ExpertsFormatError("rows and cols must be non-negative integers");
  }
  const n = rows * cols;
  if (map.length !== 2 * n) {
    throw new ExpertsFormatError(`map has ${map.length / 2} experts, rows × cols is ${n}`);
  }
  const tier = new Uint8Array(n);
  const heat = new Uint8Array(n);
  for (let i = 0; i < n; i++) {
    const b = hexByte(map, 2 * i);
    tier[i] = b >> 6;
    heat[i] = b & 63;
  }
  return { rows, cols, tier, heat };
}

/** Indices of the experts routed in the last turn. A short or empty bitmap means "none". */
export function decodeHits(hits: string, n: number): number[] {
  const out: number[] = [];
  const bytes = Math.min(hits.length >> 1, (n + 7) >> 3);
  for (let k = 0; k < bytes; k++) {
    const b = hexByte(hits, 2 * k);
    if (b === 0) continue;
    for (let bit = 0; bit < 8; bit++) {
      const i = (k << 3) | bit;
      if (i < n && (b >> bit) & 1) out.push(i);
    }
  }
  return out;
}

export function brightness(heat: number): number {
  return 0.35 + 0.65 * Math.min(heat / 24, 1);
}

/** Per-animation-frame decay of a hit flash; a flash starts at 1. */
export const FLASH_DECAY = 0.94;
export const FLASH_FLOOR = 0.02;

export function decayFlash(flash: Float32Array): boolean {
  let live = false;
  for (let i = 0; i < flash.length; i++) {
    const f = flash[i] ?? 0;
    if (f <= 0) continue;
    const next = f * FLASH_DECAY;
    flash[i] = next < FLASH_FLOOR ? 0 : next;
    if (flash[i]! > 0) live = true;
  }
  return live;
}

/** Tier colour at the heat's brightness, blended toward white by the flash (0..1). */
/** The largest cell the live grid draws: a model with few experts per layer still fills
 * the canvas's width, without squares so large the grid stops reading as a grid. */
export const MAX_CELL = 96;

/** Side of one expert's cell, in CSS pixels, for a grid of `cols` experts in `width` pixels. */
export function gridCell(width: number, cols: number): number {
  return Math.max(2, Math.min(MAX_CELL, Math.floor(width / Math.max(1, cols))));
}

export function cellColour(tier: number, heat: number, flash = 0): [number, number, number] {
  const base = TIER_COLOURS[tier] ?? TIER_COLOURS[0]!;
  const k = brightness(heat);
  const f = Math.max(0, Math.min(1, flash));
  return [0, 1, 2].map((c) => Math.round(base[c]! * k * (1 - f) + 255 * f)) as [number, number, number];
}

export function tierName(tier: number): string {
  return TIER_NAMES[tier] ?? `tier ${tier}`;
}

export function heatText(heat: number): string {
  return heat === 0 ? "never routed" : `~2^${heat} selections`;
}

/** A stable fingerprint of a map, so a test or the page can tell that it changed. */
export function mapSignature(body: ExpertsBody): string {
  let h = 2166136261;
  const text = `${body.rows}x${body.cols}:${body.map}`;
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 16777619);
  }
  return (h >>> 0).toString(16).padStart(8, "0");
}
