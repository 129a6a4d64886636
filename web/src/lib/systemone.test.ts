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

  it("drops malformed choices rather than drawing NaN", () => {
    const v = view({ answer: "a", choices: [{ option: "a", p: 1 }, { option: "b", p: Number.NaN }, {} as never] });
    expect(v.choices).toHaveLength(1);
    expect(v.unsure).toBe(false);
  });
});
