/// <reference types="vitest/config" />
import react from "@vitejs/plugin-react";
import { defineConfig } from "vite";

export default defineConfig({
  plugins: [react()],
  // Served by `colibri serve` at `/`; the SPA fallback answers every extension-less path.
  base: "/",
  build: { outDir: "dist", emptyOutDir: true, sourcemap: false },
  test: { include: ["src/**/*.test.ts", "src/**/*.test.tsx"], environment: "node" },
});
