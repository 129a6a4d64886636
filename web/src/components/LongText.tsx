import { memo } from "react";

/**
 * Text rendered in blocks of about BLOCK characters: while a reply streams only the last block
 * changes, so React re-renders one small node per flush however long the reply is, and
 * `content-visibility: auto` lets the browser skip laying out blocks that are off screen.
 * Blocks end after a newline where there is one in reach, so a block boundary is not a visible
 * line break in the middle of a line; a completed block never changes as the text grows.
 */
export const BLOCK = 4096;

export function splitBlocks(text: string, size: number = BLOCK): string[] {
  const blocks: string[] = [];
  let start = 0;
  while (text.length - start > size) {
    const nl = text.lastIndexOf("\n", start + size - 1);
    const end = nl >= start + size / 2 ? nl + 1 : start + size;
    blocks.push(text.slice(start, end));
    start = end;
  }
  if (start < text.length || blocks.length === 0) blocks.push(text.slice(start));
  return blocks;
}

const Block = memo(function Block({ text }: { text: string }) {
  return <div className="text-block">{text}</div>;
});

export function LongText({ text, className }: { text: string; className?: string }) {
  return (
    <div className={className ? `long-text ${className}` : "long-text"}>
      {splitBlocks(text).map((b, i) => (
        <Block key={i} text={b} />
      ))}
    </div>
  );
}
