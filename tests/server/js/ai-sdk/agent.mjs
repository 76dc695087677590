// The Vercel AI SDK (`ai` with `@ai-sdk/openai`) against a running frugal-proxy: an agent with
// one tool that has an `execute`, run with generateText and with streamText, on the Responses
// API (`openai(model)`, the SDK's default) and on Chat Completions (`openai.chat(model)`), each
// stopped by `stopWhen: stepCountIs(MAX_STEPS)`. On the local route the first step's
// `toolChoice` is "required", so that the tool's result goes back to the local model.
// Usage: node agent.mjs BASE_URL ROUTE   (ROUTE: "api" or "local"; prints one JSON line: the
// step limit, and what each run saw, keyed "<function>/<responses|chat>")
import { createOpenAI } from "@ai-sdk/openai";
import { generateText, stepCountIs, streamText, tool } from "ai";
import { z } from "zod";

const MAX_STEPS = 5;
const [baseURL, route] = process.argv.slice(2);
const headers = route === "api" ? { "x-frugal-route": "api" } : { "x-frugal-min-quality": "0" };
const openai = createOpenAI({ baseURL, apiKey: "sk-unused" });

const runs = [];
const getWeather = tool({
  description: "The current weather in a city.",
  inputSchema: z.object({ city: z.string() }),
  execute: async ({ city }) => {
    runs[runs.length - 1].executed.push(city);
    return city === "Paris" ? "sunny, 21 C" : `no weather known for ${city}`;
  },
});

const models = { responses: openai("gpt-4o-mini"), chat: openai.chat("gpt-4o-mini") };
const settings = (model) => ({
  model,
  prompt: "What is the weather in Paris?",
  tools: { get_weather: getWeather },
  stopWhen: stepCountIs(MAX_STEPS),
  maxOutputTokens: 48,
  maxRetries: 0,
  headers,
  // locally, the first step must call the tool (the engine holds SmolLM2 to it with a grammar);
  // the steps after it are the model's own choice
  prepareStep: ({ stepNumber }) =>
    route === "local" && stepNumber === 0 ? { toolChoice: "required" } : {},
});

const seen = {};
for (const [name, model] of Object.entries(models)) {
  for (const fn of ["generateText", "streamText"]) {
    const run = { executed: [] };
    runs.push(run);
    try {
      let result;
      let deltas = "";
      if (fn === "generateText") {
        result = await generateText(settings(model));
      } else {
        let failure = null;
        result = streamText({ ...settings(model), onError: ({ error }) => (failure = error) });
        for await (const delta of result.textStream) deltas += delta;
        if (failure) throw failure;
      }
      const steps = await result.steps;
      Object.assign(run, {
        text: await result.text,
        deltas: fn === "streamText" ? deltas : null,
        finish: await result.finishReason,
        steps: steps.map((step) => ({
          finish: step.finishReason,
          calls: step.toolCalls.map((call) => [call.toolName, call.input, call.toolCallId]),
          results: step.toolResults.map((r) => r.output),
          text: step.text,
        })),
        error: null,
      });
    } catch (error) {
      run.error = `${error?.name}: ${error?.message}`;
    }
    seen[`${fn}/${name}`] = run;
  }
}
console.log(JSON.stringify({ max_steps: MAX_STEPS, runs: seen }));
