// Numbers for the dashboard: the report's money kept exact, written in the reader's locale.
//
// The report writes money as JSON numbers with six decimals ("saved_usd": 3.250000). A float
// cannot hold every such number, so money never becomes one here: parseReport keeps each
// "*_usd" value as the decimal text the server wrote (the JSON.parse reviver's source text;
// where a browser lacks it, toFixed(6) of the parsed number, which gives the same text for any
// amount under a billion dollars), sums are BigInt micro-dollars, and money() writes the text
// in the locale's symbols digit by digit. Only the charts draw floats.
"use strict";

const FrugalFormat = (() => {
  const locale = navigator.languages && navigator.languages.length ? navigator.languages[0] : undefined;
  const MONEY = /^(-?)(\d+)(?:\.(\d+))?$/;

  function isMoneyKey(key) {
    return typeof key === "string" && key.endsWith("_usd");
  }

  function parseReport(text) {
    return JSON.parse(text, (key, value, context) => {
      if (!isMoneyKey(key) || typeof value !== "number") return value;
      if (context && typeof context.source === "string") return context.source;
      return value.toFixed(6);
    });
  }

  // "12.345678" -> 12345678n micro-dollars; null for anything that is not a decimal.
  function micros(text) {
    const m = MONEY.exec(String(text));
    if (!m) return null;
    const frac = (m[3] || "").padEnd(6, "0");
    if (frac.length > 6) return null;
    const value = BigInt(m[2]) * 1000000n + BigInt(frac);
    return m[1] ? -value : value;
  }

  function fromMicros(value) {
    const negative = value < 0n;
    const abs = negative ? -value : value;
    const frac = String(abs % 1000000n).padStart(6, "0");
    return `${negative ? "-" : ""}${abs / 1000000n}.${frac}`;
  }

  // The locale's pieces: digits, decimal separator, and where the sign and "$" go.
  const shapes = new Map();
  function shape(negative) {
    const key = negative ? "-" : "+";
    if (!shapes.has(key)) {
      const currency = new Intl.NumberFormat(locale, {
        style: "currency",
        currency: "USD",
        maximumFractionDigits: 0,
        minimumFractionDigits: 0,
      });
      const plain = new Intl.NumberFormat(locale, { useGrouping: false });
      const digits = Array.from({ length: 10 }, (_, d) => plain.format(d));
      const decimal = new Intl.NumberFormat(locale)
        .formatToParts(1.5)
        .find((p) => p.type === "decimal");
      shapes.set(key, {
        template: currency.formatToParts(negative ? -1n : 1n),
        digits,
        decimal: decimal ? decimal.value : ".",
      });
    }
    return shapes.get(key);
  }

  function grouped(intText) {
    return new Intl.NumberFormat(locale, { maximumFractionDigits: 0 }).format(BigInt(intText));
  }

  // Money as segments, [{text, minor}]: the cents in full, the four sub-cent decimals minor,
  // so that a page can write them smaller. Joined, they are the exact value.
  function moneyParts(text) {
    const m = MONEY.exec(String(text));
    if (!m) return [{ text: String(text), minor: false }];
    const negative = m[1] === "-" && /[1-9]/.test(m[2] + (m[3] || ""));
    const { template, digits, decimal } = shape(negative);
    const frac = (m[3] || "").replace(/\d/g, (d) => digits[Number(d)]);
    const out = [];
    for (const part of template) {
      if (part.type === "integer") {
        out.push({ text: grouped(m[2]), minor: false });
        if (frac) {
          out.push({ text: decimal + frac.slice(0, 2), minor: false });
          if (frac.length > 2) out.push({ text: frac.slice(2), minor: true });
        }
      } else if (part.type !== "group") {
        out.push({ text: part.value, minor: false });
      }
    }
    return out;
  }

  function money(text) {
    return moneyParts(text)
      .map((p) => p.text)
      .join("");
  }

  function integer(n) {
    return new Intl.NumberFormat(locale).format(n);
  }

  function percent(share, digits = 1) {
    if (share === null || share === undefined) return "–";
    return new Intl.NumberFormat(locale, {
      style: "percent",
      minimumFractionDigits: digits,
      maximumFractionDigits: digits,
    }).format(share);
  }

  function decimal(n, digits = 1) {
    if (n === null || n === undefined) return "–";
    return new Intl.NumberFormat(locale, {
      minimumFractionDigits: digits,
      maximumFractionDigits: digits,
    }).format(n);
  }

  function seconds(s) {
    return `${decimal(s, 1)} s`;
  }

  function day(iso) {
    const [y, mo, d] = iso.split("-").map(Number);
    return new Intl.DateTimeFormat(locale, {
      month: "short",
      day: "numeric",
      weekday: "short",
      timeZone: "UTC",
    }).format(new Date(Date.UTC(y, mo - 1, d)));
  }

  function monthName(label) {
    const [y, mo] = label.split("-").map(Number);
    return new Intl.DateTimeFormat(locale, {
      year: "numeric",
      month: "long",
      timeZone: "UTC",
    }).format(new Date(Date.UTC(y, mo - 1, 1)));
  }

  function clock(date) {
    return new Intl.DateTimeFormat(locale, { timeStyle: "medium" }).format(date);
  }

  // A CSV file: cells of kind "text" that a spreadsheet would read as a formula get a quote.
  function csv(header, rows) {
    const cell = (value, kind) => {
      let text = value === null || value === undefined ? "" : String(value);
      if (kind === "text" && /^[=+\-@\t\r]/.test(text)) text = "'" + text;
      return /[",\r\n]/.test(text) ? `"${text.replace(/"/g, '""')}"` : text;
    };
    const lines = [header.map((h) => cell(h, "text")).join(",")];
    for (const row of rows) lines.push(row.map((c) => cell(c.value, c.kind)).join(","));
    return lines.join("\r\n") + "\r\n";
  }

  return {
    locale,
    parseReport,
    micros,
    fromMicros,
    moneyParts,
    money,
    integer,
    percent,
    decimal,
    seconds,
    day,
    monthName,
    clock,
    csv,
  };
})();
