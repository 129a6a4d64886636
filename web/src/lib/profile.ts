/**
 * `/profile` aggregation: per-turn phases from the engine's PROF lines. A phase every turn in
 * the window reports as exactly 0 is treated as not measured by this engine (colibri's own
 * reference engine does not time matmul, attention or the LM head), so the page says so
 * instead of drawing a zero.
 */

export interface ProfileTurn {
  wall_s: number;
  prompt_tokens: number;
  completion_tokens: number;
  expert_disk_s: number;
  expert_wait_s: number;
  expert_matmul_s: number;
  attention_s: number;
  lm_head_s: number;
  forwards: number;
}

export interface ProfileBody {
  seq: number;
  turns: ProfileTurn[];
}

export type PhaseKey = "expert_wait_s" | "expert_matmul_s" | "attention_s" | "lm_head_s";

export const PHASES: readonly { key: PhaseKey; label: string }[] = [
  { key: "expert_wait_s", label: "I/O wait" },
  { key: "expert_matmul_s", label: "expert matmul" },
  { key: "attention_s", label: "attention" },
  { key: "lm_head_s", label: "LM head" },
];

export const WINDOW = 30;

export interface TurnView {
  /** Position of the turn in the engine's history (seq numbering, 1-based). */
  number: number;
  wall: number;
  phases: Record<PhaseKey, number>;
  other: number;
  disk: number;
  promptTokens: number;
  completionTokens: number;
  forwards: number;
  tokensPerForward: number | null;
  tokensPerSecond: number | null;
}

export interface ProfileView {
  seq: number;
  turns: TurnView[];
  measured: Record<PhaseKey, boolean>;
  diskMeasured: boolean;
  meanTokensPerSecond: number | null;
  meanTokensPerForward: number | null;
}

const num = (v: unknown): number => (typeof v === "number" && Number.isFinite(v) && v > 0 ? v : 0);

export function aggregate(body: ProfileBody, window: number = WINDOW): ProfileView {
  const all = Array.isArray(body.turns) ? body.turns : [];
  const recent = all.slice(-window);
  const firstNumber = Math.max(1, body.seq - recent.length + 1);
  const turns = recent.map((t, i): TurnView => {
    const phases = {} as Record<PhaseKey, number>;
    let attributed = 0;
    for (const { key } of PHASES) {
      phases[key] = num(t[key]);
      attributed += phases[key];
    }
    const wall = num(t.wall_s);
    const forwards = num(t.forwards);
    const completion = num(t.completion_tokens);
    return {
      number: firstNumber + i,
      wall,
      phases,
      // Phases can overlap (pipelined engines), so "other" never goes below zero.
      other: Math.max(0, wall - attributed),
      disk: num(t.expert_disk_s),
      promptTokens: num(t.prompt_tokens),
      completionTokens: completion,
      forwards,
      tokensPerForward: forwards > 0 ? completion / forwards : null,
      tokensPerSecond: wall > 0 && completion > 0 ? completion / wall : null,
    };
  });
  const measured = {} as Record<PhaseKey, boolean>;
  for (const { key } of PHASES) measured[key] = turns.some((t) => t.phases[key] > 0);
  const tps = turns.map((t) => t.tokensPerSecond).filter((v): v is number => v !== null);
  const tpf = turns.map((t) => t.tokensPerForward).filter((v): v is number => v !== null);
  const mean = (xs: number[]) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : null);
  return {
    seq: typeof body.seq === "number" ? body.seq : 0,
    turns,
    measured,
    diskMeasured: turns.some((t) => t.disk > 0),
    meanTokensPerSecond: mean(tps),
    meanTokensPerForward: mean(tpf),
  };
}
