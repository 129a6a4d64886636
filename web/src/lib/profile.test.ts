import { describe, expect, it } from "vitest";
import { aggregate, type ProfileTurn } from "./profile";

const turn = (over: Partial<ProfileTurn> = {}): ProfileTurn => ({
  wall_s: 1,
  prompt_tokens: 10,
  completion_tokens: 20,
  expert_disk_s: 0,
  expert_wait_s: 0,
  expert_matmul_s: 0,
  attention_s: 0,
  lm_head_s: 0,
  forwards: 20,
  ...over,
});

describe("aggregate", () => {
  it("puts what the phases do not cover into other", () => {
    const v = aggregate({ seq: 1, turns: [turn({ wall_s: 2, expert_wait_s: 0.5, attention_s: 0.25 })] });
    expect(v.turns[0]?.other).toBeCloseTo(1.25);
    expect(v.turns[0]?.phases.expert_wait_s).toBe(0.5);
  });

  it("never draws a negative other when phases overlap", () => {
    const v = aggregate({ seq: 1, turns: [turn({ wall_s: 1, expert_matmul_s: 0.8, attention_s: 0.6 })] });
    expect(v.turns[0]?.other).toBe(0);
  });

  it("marks a phase that is 0 in every turn as not measured", () => {
    const v = aggregate({ seq: 2, turns: [turn({ expert_disk_s: 0.005 }), turn({ attention_s: 0.1 })] });
    expect(v.measured).toEqual({ expert_wait_s: false, expert_matmul_s: false, attention_s: true, lm_head_s: false });
    expect(v.diskMeasured).toBe(true);
  });

  it("reports tokens per forward (MTP > 1) and tok/s", () => {
    const v = aggregate({ seq: 1, turns: [turn({ completion_tokens: 36, forwards: 20, wall_s: 4 })] });
    expect(v.turns[0]?.tokensPerForward).toBeCloseTo(1.8);
    expect(v.turns[0]?.tokensPerSecond).toBeCloseTo(9);
    expect(aggregate({ seq: 1, turns: [turn({ forwards: 0 })] }).turns[0]?.tokensPerForward).toBeNull();
  });

  it("keeps the last 30 turns and numbers them from seq", () => {
    const turns = Array.from({ length: 40 }, (_, i) => turn({ completion_tokens: i + 1 }));
    const v = aggregate({ seq: 100, turns });
    expect(v.turns).toHaveLength(30);
    expect(v.turns[0]?.completionTokens).toBe(11);
    expect(v.turns[29]?.number).toBe(100);
    expect(v.turns[0]?.number).toBe(71);
  });

  it("treats negative, NaN and missing values as 0", () => {
    const v = aggregate({ seq: 1, turns: [{ ...turn(), wall_s: -1, attention_s: Number.NaN } as ProfileTurn] });
    expect(v.turns[0]?.wall).toBe(0);
    expect(v.turns[0]?.tokensPerSecond).toBeNull();
    expect(aggregate({ seq: 0, turns: [] }).meanTokensPerSecond).toBeNull();
  });
});
