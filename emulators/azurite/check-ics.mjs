// Read an iCalendar file with ical.js (the parser of Mozilla's calendar clients, Thunderbird's
// among them) and print what a client would import, one JSON object per VEVENT; exit 1 with the
// parser's error when the file does not parse. Used by tests/functions/test_workflow_calendar.py.
import { readFileSync } from "node:fs";
import ICAL from "ical.js";

const text = readFileSync(process.argv[2], "utf8");
let calendar;
try {
  calendar = new ICAL.Component(ICAL.parse(text));
} catch (error) {
  console.error(`not iCalendar: ${error.message}`);
  process.exit(1);
}
if (calendar.name !== "vcalendar") {
  console.error(`top component is ${calendar.name}`);
  process.exit(1);
}
const events = calendar.getAllSubcomponents("vevent").map((component) => {
  const event = new ICAL.Event(component);
  return {
    uid: event.uid,
    sequence: event.sequence,
    status: component.getFirstPropertyValue("status"),
    start: event.startDate.toJSDate().toISOString(),
    end: event.endDate.toJSDate().toISOString(),
    summary: event.summary,
    description: event.description,
  };
});
console.log(JSON.stringify({ version: calendar.getFirstPropertyValue("version"), events }));
