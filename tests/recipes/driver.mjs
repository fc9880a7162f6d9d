// Runs a Node recipe: `node driver.mjs RECIPE.mjs TICKET...`, as driver.py does for Python.
// The recipe exports handle(ticket); one JSON line per call: its answer, or its error.
import { pathToFileURL } from "node:url";

const [recipe, ...tickets] = process.argv.slice(2);
const { handle } = await import(pathToFileURL(recipe).href);
for (const ticket of tickets) {
  try {
    console.log(JSON.stringify({ answer: String(await handle(ticket)) }));
  } catch (err) {
    const { status, code, type } = err;
    console.log(JSON.stringify({ error: err.constructor.name, message: err.message, status, code, type }));
  }
}
