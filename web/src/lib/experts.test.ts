import { describe, expect, it } from "vitest";
import { brightness, cellColour, decayFlash, decodeHits, decodeMap, ExpertsFormatError, gridCell, heatText, MAX_CELL, mapSignature, tierName } from "./experts";

describe("decodeMap", () => {
  it("reads tier from the top two bits and heat from the low six, row-major", () => {
    // 0x00 disk/0, 0x45 RAM/5, 0x9f VRAM/31, 0x3f disk/63
    const g = decodeMap({ rows: 2, cols: 2, map: "00459f3f", hits: "", seq: 0 });
    expect([...g.tier]).toEqual([0, 1, 2, 0]);
    expect([...g.heat]).toEqual([0, 5, 31, 63]);
  });

  it("refuses a map whose length is not rows × cols", () => {
    expect(() => decodeMap({ rows: 2, cols: 8, map: "00", hits: "", seq: 0 })).toThrow(ExpertsFormatError);
    expect(() => decodeMap({ rows: 1, cols: 1, map: "zz", hits: "", seq: 0 })).toThrow(ExpertsFormatError);
  });

  it("accepts the unauthenticated empty body", () => {
    const g = decodeMap({ rows: 0, cols: 0, map: "", hits: "", seq: 0 });
    expect(g.tier.length).toBe(0);
  });
});

describe("decodeHits", () => {
  it("puts expert i at byte i>>3, bit i&7", () => {
    // byte 0 = 0x05 -> experts 0 and 2; byte 1 = 0x80 -> expert 15
    expect(decodeHits("0580", 16)).toEqual([0, 2, 15]);
  });

  it("ignores bits past the expert count and an empty bitmap", () => {
    expect(decodeHits("ff", 3)).toEqual([0, 1, 2]);
    expect(decodeHits("", 16)).toEqual([]);
    expect(decodeHits("0000", 16)).toEqual([]);
  });
});

describe("colours", () => {
  it("brightness runs from 0.35 at heat 0 to 1 at heat 24 and beyond", () => {
    expect(brightness(0)).toBeCloseTo(0.35);
    expect(brightness(12)).toBeCloseTo(0.675);
    expect(brightness(24)).toBeCloseTo(1);
    expect(brightness(63)).toBeCloseTo(1);
  });

  it("uses colibri's tier colours and blends a flash toward white", () => {
    expect(cellColour(2, 24)).toEqual([78, 214, 165]);
    expect(cellColour(1, 24)).toEqual([90, 155, 216]);
    expect(cellColour(0, 0)).toEqual([20, 25, 28]);
    expect(cellColour(0, 0, 1)).toEqual([255, 255, 255]);
  });

  it("decays a flash by 0.94 a frame until it is gone", () => {
    const f = new Float32Array([1, 0]);
    expect(decayFlash(f)).toBe(true);
    expect(f[0]).toBeCloseTo(0.94);
    let frames = 1;
    while (decayFlash(f)) frames++;
    expect(f[0]).toBe(0);
    expect(frames).toBe(Math.floor(Math.log(0.02) / Math.log(0.94)));
  });

  it("names tiers and heat as colibri's tooltip does", () => {
    expect(tierName(0)).toBe("disk");
    expect(tierName(2)).toBe("VRAM");
    expect(heatText(0)).toBe("never routed");
    expect(heatText(7)).toBe("~2^7 selections");
  });

  it("changes signature when the map changes", () => {
    const a = mapSignature({ rows: 1, cols: 2, map: "0000", hits: "", seq: 0 });
    const b = mapSignature({ rows: 1, cols: 2, map: "0001", hits: "", seq: 0 });
    expect(a).not.toBe(b);
  });
});

describe("gridCell", () => {
  it("fills the canvas's width with few experts, up to MAX_CELL", () => {
    expect(gridCell(1200, 16)).toBe(75); // the default model: 16 experts fill 1200 px
    expect(gridCell(1200, 4)).toBe(MAX_CELL);
  });

  it("shrinks to 2 px for wide grids and never divides by zero", () => {
    expect(gridCell(600, 256)).toBe(2);
    expect(gridCell(600, 0)).toBe(MAX_CELL);
  });
});

