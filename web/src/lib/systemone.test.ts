import { describe, expect, it } from "vitest";
import { parseOptions, view } from "./systemone";

describe("systemone", () => {
  it("reads one option per line, trimmed, without blanks or repeats", () => {
    expect(parseOptions(" yes\n\nno \nyes\n")).toEqual(["yes", "no"]);
  });

  it("sorts choices by p and is sure of a peaked distribution", () => {
    const v = view({ answer: "yes", entropy: 0.1, choices: [{ option: "no", p: 0.02 }, { option: "yes", p: 0.98 }] });
    expect(v.choices.map((c) => c.option)).toEqual(["yes", "no"]);
    expect(v.unsure).toBe(false);
    expect(v.serverEntropy).toBe(0.1);
    expect(v.entropyBits).toBeCloseTo(-(0.98 * Math.log2(0.98) + 0.02 * Math.log2(0.02)));
  });

  it("says unsure for a flat distribution", () => {
    const v = view({ answer: "a", choices: [{ option: "a", p: 0.34 }, { option: "b", p: 0.33 }, { option: "c", p: 0.33 }] });
    expect(v.normalised).toBeGreaterThan(0.99);
    expect(v.unsure).toBe(true);
  });

  it("says how much of the model's probability the allowed answers hold, and warns when it is tiny", () => {
    const sure = view({ answer: "no", choices: [{ option: "no", p: 0.9, logprob: Math.log(0.6) }, { option: "yes", p: 0.1, logprob: Math.log(0.066) }] });
    expect(sure.covered).toBeCloseTo(0.666);
    expect(sure.outOfDepth).toBe(false);
    // Both answers unlikely: normalised, "no" still looks certain; the total gives it away.
    const lost = view({ answer: "no", choices: [{ option: "no", p: 1, logprob: -12.9 }, { option: "yes", p: 0, logprob: -30.2 }] });
    expect(lost.unsure).toBe(false);
    expect(lost.covered).toBeCloseTo(Math.exp(-12.9) + Math.exp(-30.2));
    expect(lost.outOfDepth).toBe(true);
    // "Tiny" is under one half: the model's own first choice is then none of the answers.
    const half = view({ answer: "no", choices: [{ option: "no", p: 0.75, logprob: Math.log(0.3) }, { option: "yes", p: 0.25, logprob: Math.log(0.1) }] });
    expect(half.covered).toBeCloseTo(0.4);
    expect(half.outOfDepth).toBe(true);
    const bare = view({ answer: "a", choices: [{ option: "a", p: 0.7 }, { option: "b", p: 0.3 }] });
    expect(bare.covered).toBeNull();
    expect(bare.outOfDepth).toBe(false);
  });

  it("drops malformed choices rather than drawing NaN", () => {
    const v = view({ answer: "a", choices: [{ option: "a", p: 1 }, { option: "b", p: Number.NaN }, {} as never] });
    expect(v.choices).toHaveLength(1);
    expect(v.unsure).toBe(false);
  });
});
