import { describe, expect, it } from "vitest";
import { NO_EXAMPLES, parseExamples } from "./examples";

describe("examples", () => {
  it("reads the served chat prompts and the System One question", () => {
    const e = parseExamples({
      chat: [{ prompt: "What is 34 + 52?", skill: "two-digit sums" }, { prompt: "Convert 3 kg to g.", skill: null }],
      systemone: { state: "Review: good.", question: "Is this review positive or negative?", options: ["positive", "negative"] },
    });
    expect(e.chat.map((c) => c.prompt)).toEqual(["What is 34 + 52?", "Convert 3 kg to g."]);
    expect(e.chat[1]?.skill).toBeNull();
    expect(e.systemone?.options).toEqual(["positive", "negative"]);
  });

  it("offers nothing for a model without examples or a document it cannot read", () => {
    expect(parseExamples({ chat: [], systemone: null })).toEqual(NO_EXAMPLES);
    expect(parseExamples(null)).toEqual(NO_EXAMPLES);
    expect(parseExamples({ chat: [{ prompt: "" }, 3], systemone: { question: "q", options: ["only"] } })).toEqual(NO_EXAMPLES);
  });
});
