/**
 * System One (`POST /v1/systemone`): closed-set answers. The request is
 * `{model, state, question, options}`; the reply `{answer, entropy, choices:[{option, p,
 * logprob, mean_logprob, tokens}], usage}` (the shape colibri's dashboard tests pin).
 */

export interface SystemOneChoice {
  option: string;
  p: number;
  logprob?: number;
  mean_logprob?: number;
  tokens?: number;
}

export interface SystemOneReply {
  answer: string;
  entropy?: number;
  normalize?: unknown;
  choices: SystemOneChoice[];
  usage?: { prompt_tokens?: number; completion_tokens?: number; total_tokens?: number };
}

/** Normalised entropy at or above which the page says the model is unsure. */
export const UNSURE_AT = 0.5;

/**
 * Total probability (the sum of each allowed answer's exp(logprob)) under which the page warns
 * that the model is out of its depth ("tiny"): `p` is normalised over the allowed answers, so a
 * confident-looking answer can rest on a model that would have said something else entirely.
 * Below one half the model's own first choice is none of the allowed answers; a question the
 * default model was trained on puts over 0.99 on them.
 */
export const COVERED_AT_LEAST = 0.5;

export interface SystemOneView {
  answer: string;
  choices: SystemOneChoice[];
  /** Entropy of the option distribution, in bits, computed here from `p`. */
  entropyBits: number;
  /** Entropy / log2(n options): 0 certain, 1 uniform. */
  normalised: number;
  unsure: boolean;
  serverEntropy: number | null;
  /** Σ exp(logprob) over the allowed answers: how much of the model's probability they hold
   * (null when the server sent no logprobs). */
  covered: number | null;
  /** The allowed answers hold less than COVERED_AT_LEAST of the model's probability. */
  outOfDepth: boolean;
}

export function parseOptions(text: string): string[] {
  const seen = new Set<string>();
  const out: string[] = [];
  for (const line of text.split("\n")) {
    const v = line.trim();
    if (v && !seen.has(v)) {
      seen.add(v);
      out.push(v);
    }
  }
  return out;
}

export function view(reply: SystemOneReply): SystemOneView {
  const choices = (Array.isArray(reply.choices) ? reply.choices : [])
    .filter((c) => typeof c?.option === "string" && typeof c.p === "number" && Number.isFinite(c.p))
    .slice()
    .sort((a, b) => b.p - a.p);
  const total = choices.reduce((a, c) => a + Math.max(0, c.p), 0);
  let h = 0;
  for (const c of choices) {
    const p = total > 0 ? Math.max(0, c.p) / total : 0;
    if (p > 0) h -= p * Math.log2(p);
  }
  const n = choices.length;
  const normalised = n > 1 ? h / Math.log2(n) : 0;
  const logprobs = choices.map((c) => c.logprob).filter((l): l is number => typeof l === "number" && Number.isFinite(l));
  const covered = n > 0 && logprobs.length === n ? logprobs.reduce((a, l) => a + Math.exp(l), 0) : null;
  return {
    answer: typeof reply.answer === "string" ? reply.answer : (choices[0]?.option ?? ""),
    choices,
    entropyBits: h,
    normalised,
    unsure: n > 1 && normalised >= UNSURE_AT,
    serverEntropy: typeof reply.entropy === "number" ? reply.entropy : null,
    covered,
    outOfDepth: covered !== null && covered < COVERED_AT_LEAST,
  };
}
