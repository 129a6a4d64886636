import { memo } from "react";

/**
 * Text rendered in fixed-size blocks: while a reply streams only the last block changes, so
 * React re-renders one small node per flush however long the reply is, and
 * `content-visibility: auto` lets the browser skip laying out blocks that are off screen.
 */
export const BLOCK = 4096;

const Block = memo(function Block({ text }: { text: string }) {
  return <span className="text-block">{text}</span>;
});

export function LongText({ text, className }: { text: string; className?: string }) {
  const blocks: string[] = [];
  for (let i = 0; i < text.length; i += BLOCK) blocks.push(text.slice(i, i + BLOCK));
  return (
    <div className={className ? `long-text ${className}` : "long-text"}>
      {blocks.map((b, i) => (
        <Block key={i} text={b} />
      ))}
    </div>
  );
}
