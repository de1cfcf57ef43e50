"""An ordinary pymesos scheduler, run by tests/test_mesos_pymesos.py with the pymesos venv
(scripts/pymesos_venv.py; Python 3.10, so nothing of mesolite is imported here).

    python pymesos_scheduler.py --master 127.0.0.1:5051 --name A --tasks 3 \\
        --cpus 1 --mem 64 --command "sleep 1"

It launches `--tasks` command tasks of <cpus, mem> as offers allow, declines what it
cannot use, and prints one JSON line per thing it sees (registered, offers, update,
heartbeat, error, disconnected). It reads commands from stdin, one per line:
`reconcile [TASK_ID ...]`, `kill TASK_ID`, `stop` (TEARDOWN, then exit); or, with
`--until-done`, tears down once every task has ended.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading

from pymesos import MesosSchedulerDriver, Scheduler

_print_lock = threading.Lock()
TERMINAL = {"TASK_FINISHED", "TASK_FAILED", "TASK_KILLED", "TASK_LOST", "TASK_ERROR"}


def emit(**fields):
    with _print_lock:
        sys.stdout.write(json.dumps(fields) + "\n")
        sys.stdout.flush()


def scalar(resources, name):
    return sum(r["scalar"]["value"] for r in resources if r["name"] == name)


class Launcher(Scheduler):
    def __init__(self, args):
        self.args = args
        self.launched = 0
        self.ended = set()
        self.lock = threading.Lock()
        self.all_ended = threading.Event()

    def registered(self, driver, framework_id, master_info):
        emit(event="registered", framework_id=framework_id["value"])

    def reregistered(self, driver, master_info):
        emit(event="reregistered")

    def resourceOffers(self, driver, offers):
        emit(event="offers", count=len(offers), offers=offers)
        a = self.args
        for offer in offers:
            cpus = scalar(offer["resources"], "cpus")
            mem = scalar(offer["resources"], "mem")
            tasks = []
            with self.lock:
                while (
                    self.launched < a.tasks
                    and len(tasks) < a.per_offer
                    and cpus >= a.cpus
                    and mem >= a.mem
                ):
                    self.launched += 1
                    cpus -= a.cpus
                    mem -= a.mem
                    tasks.append(
                        {
                            "name": f"{a.name}-{self.launched}",
                            "task_id": {"value": f"{a.name}-{self.launched}"},
                            "agent_id": offer["agent_id"],
                            "resources": [
                                {"name": "cpus", "type": "SCALAR", "scalar": {"value": a.cpus}},
                                {"name": "mem", "type": "SCALAR", "scalar": {"value": a.mem}},
                            ],
                            "command": {"value": a.command},
                        }
                    )
            if tasks:
                driver.launchTasks(offer["id"], tasks, {"refuse_seconds": a.refuse_seconds})
                emit(event="launched", tasks=[t["task_id"]["value"] for t in tasks])
            else:
                driver.declineOffer(offer["id"], {"refuse_seconds": a.refuse_seconds})

    def offerRescinded(self, driver, offer_id):
        emit(event="rescind", offer_id=offer_id["value"])

    def statusUpdate(self, driver, update):
        emit(
            event="update",
            task_id=update["task_id"]["value"],
            state=update["state"],
            message=update.get("message", ""),
            source=update.get("source"),
            reason=update.get("reason"),
            agent_id=update.get("agent_id", {}).get("value"),
            uuid="uuid" in update,
        )
        if update["state"] in TERMINAL:
            self.ended.add(update["task_id"]["value"])
            if len(self.ended) >= self.args.tasks:
                self.all_ended.set()

    def processHeartBeat(self, driver):
        emit(event="heartbeat")

    def error(self, driver, message):
        emit(event="error", message=message)

    def disconnected(self, driver):
        emit(event="disconnected")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--master", required=True)
    parser.add_argument("--name", default="pymesos")
    parser.add_argument("--role", default="*")
    parser.add_argument("--tasks", type=int, default=1)
    parser.add_argument("--cpus", type=float, default=1.0)
    parser.add_argument("--mem", type=float, default=32.0)
    parser.add_argument("--command", default="true")
    parser.add_argument("--refuse-seconds", type=float, default=1.0)
    parser.add_argument("--per-offer", type=int, default=1000, help="most tasks per offer")
    parser.add_argument(
        "--until-done", action="store_true", help="tear down once every task has ended"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    framework = {"user": "", "name": args.name, "role": args.role, "failover_timeout": 60}
    scheduler = Launcher(args)
    driver = MesosSchedulerDriver(scheduler, framework, args.master, use_addict=False)
    driver.start()
    for line in [] if args.until_done else sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "reconcile":
            driver.reconcileTasks([{"task_id": {"value": t}} for t in words[1:]])
        elif words[0] == "kill":
            driver.killTask({"value": words[1]})
        elif words[0] == "stop":
            break
        emit(event="done", command=words[0])
    if args.until_done:
        scheduler.all_ended.wait()
    driver.stop()  # not a failover: pymesos sends TEARDOWN
    driver.join()
    emit(event="stopped")


if __name__ == "__main__":
    main()
