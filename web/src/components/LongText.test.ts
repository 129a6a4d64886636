import { describe, expect, it } from "vitest";
import { splitBlocks } from "./LongText";

describe("splitBlocks", () => {
  it("keeps every character, in order", () => {
    const text = Array.from({ length: 500 }, (_, i) => `line ${i} ${"x".repeat(i % 37)}\n`).join("");
    expect(splitBlocks(text, 256).join("")).toBe(text);
  });

  it("ends blocks after a newline when one is in the second half of the block", () => {
    const blocks = splitBlocks("a".repeat(200) + "\n" + "b".repeat(200), 256);
    expect(blocks[0]).toBe("a".repeat(200) + "\n");
  });

  it("cuts a line longer than a block at the block size", () => {
    expect(splitBlocks("z".repeat(600), 256).map((b) => b.length)).toEqual([256, 256, 88]);
  });

  it("never changes a completed block as the text grows", () => {
    let text = "";
    let done: string[] = [];
    for (let i = 0; i < 400; i++) {
      text += i % 7 === 0 ? "word\n" : "word ";
      const blocks = splitBlocks(text, 64);
      const complete = blocks.slice(0, -1);
      expect(complete.slice(0, done.length)).toEqual(done);
      done = complete;
    }
  });

  it("gives one empty block for empty text", () => {
    expect(splitBlocks("")).toEqual([""]);
  });
});
