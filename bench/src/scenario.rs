//! One scenario from start to end: a fresh tokenmint and fresh databases, an arm per
//! target it measures (the service, its store in-process, the two floors), a warm-up of
//! each, the measured segments in their interleaved order (see [`plan`]), and the teardown.
//! Apart from `main` so that the order and the fairness of the measurements can be read
//! (and tested) on their own.

use std::path::Path;
use std::time::Duration;

use crate::cli::{EnvArgs, Scenario};
use crate::floor::{Design, Floor};
use crate::procfs::{self, Pid};
use crate::report::{Measured, ScenarioResult};
use crate::segment::segment;
use crate::service::{Mongo, Service, connect_store};
use crate::workload::{Client, Target};

/// A target being measured: its clients, and whose CPU counts as "the service".
pub struct Arm {
    pub target: Target,
    pub clients: Vec<Client>,
    pub service_pid: Option<Pid>,
    pub measured: Measured,
}

/// Indexes of a scenario's targets (its arms).
const SERVICE: usize = 0;
const STORE: usize = 1;
const FLOOR: usize = 2;
const REFERENCE_FLOOR: usize = 3;

/// Runs scenario number `index` of the run tagged `run_tag` (database names and payment
/// ids carry both, so no two scenarios or runs share data).
pub async fn run_scenario(
    index: usize,
    scenario: &Scenario,
    env: &EnvArgs,
    mongo: &Mongo,
    work_dir: &Path,
    run_tag: &str,
) -> anyhow::Result<ScenarioResult> {
    let workload = scenario.workload;
    let tag = format!("{run_tag}_{index}");
    let service_db = format!("bench_{tag}_service");
    let store_db = format!("bench_{tag}_store");
    let floor_db = format!("bench_{tag}_floor");
    let reference_floor_db = format!("bench_{tag}_reference_floor");
    let races = workload.races > 0.0;

    let service = if scenario.service {
        let log = work_dir.join(format!("tokenmint-{index}.log"));
        let service = Service::start(
            &env.service_bin,
            mongo.uri(),
            &service_db,
            env.max_pool_size,
            &log,
        )
        .await?;
        eprintln!(
            "   tokenmint pid {} on {}, log {}",
            service.pid(),
            service.addr(),
            log.display()
        );
        Some(service)
    } else {
        None
    };
    let store = if env.with_store && scenario.service && scenario.floor {
        Some(connect_store(mongo.uri(), &store_db, env.max_pool_size).await?)
    } else {
        None
    };
    let connect_floor = |wanted: bool, database: &str, design: Design| {
        let database = database.to_owned();
        async move {
            if !wanted {
                return Ok(None);
            }
            Floor::connect(mongo.uri(), &database, env.max_pool_size, design)
                .await
                .map(Some)
        }
    };
    let floor = connect_floor(scenario.floor, &floor_db, Design::PerRequest).await?;
    let reference_floor = connect_floor(
        scenario.reference_floor,
        &reference_floor_db,
        Design::Reference,
    )
    .await?;
    // Each target with the process whose CPU counts as the service's, in arm order.
    let targets: [Option<(Target, Option<Pid>)>; 4] = [
        service.as_ref().map(|s| {
            let target = Target::Service {
                addr: s.addr(),
                api_key: s.api_key().to_owned(),
            };
            (target, Some(Pid::Id(s.pid())))
        }),
        store.as_ref().map(|s| (Target::Store(s.clone()), None)),
        floor.as_ref().map(|f| (Target::Floor(f.clone()), None)),
        reference_floor
            .as_ref()
            .map(|f| (Target::Floor(f.clone()), None)),
    ];
    let mut arms: [Option<Arm>; 4] = [None, None, None, None];
    for (arm, target) in arms.iter_mut().zip(targets) {
        let Some((target, service_pid)) = target else {
            continue;
        };
        let clients = (0..workload.concurrency)
            .map(|id| Client::new(id, env.seed, &tag, &target, races))
            .collect::<anyhow::Result<_>>()?;
        *arm = Some(Arm {
            target,
            clients,
            service_pid,
            measured: Measured::default(),
        });
    }

    // A warm-up of each target, then the measured segments, interleaved (see `plan`).
    for arm in arms.iter_mut().flatten() {
        eprintln!("   warm-up {}", target_name(&arm.target));
        segment(arm, workload, scenario.warmup, mongo, false).await;
    }
    for (which, duration) in plan(scenario.duration) {
        if let Some(arm) = arms[which].as_mut() {
            eprintln!(
                "   measure {} ({:.1} s)",
                target_name(&arm.target),
                duration.as_secs_f64()
            );
            segment(arm, workload, duration, mongo, true).await;
        }
    }

    let service_rss = service
        .as_ref()
        .and_then(|s| procfs::resident_bytes(Pid::Id(s.pid())));
    let mongod_rss = mongo
        .pid()
        .and_then(|pid| procfs::resident_bytes(Pid::Id(pid)));
    // Close the keep-alive connections before the service's graceful shutdown.
    if let Some(arm) = arms[SERVICE].as_mut() {
        arm.clients.clear();
    }
    if let Some(service) = service {
        service.stop().await;
    }
    if let Some(store) = store {
        store.store().clone().shutdown().await;
    }
    for floor in [floor, reference_floor].into_iter().flatten() {
        floor.shutdown().await;
    }
    if !env.keep_data {
        mongo
            .drop_databases(&[&service_db, &store_db, &floor_db, &reference_floor_db])
            .await;
    }
    let [service_arm, store_arm, floor_arm, reference_floor_arm] = arms;
    Ok(ScenarioResult {
        scenario: *scenario,
        service: service_arm.map(|arm| arm.measured),
        store: store_arm.map(|arm| arm.measured),
        floor: floor_arm.map(|arm| arm.measured),
        reference_floor: reference_floor_arm.map(|arm| arm.measured),
        service_rss,
        mongod_rss,
    })
}

/// The measured segments of a scenario, after the warm-up: the palindrome service ½ ·
/// (store ½) · floor ½ · reference floor 1 · floor ½ · (store ½) · service ½. Each target gets
/// the full duration, centred on the middle of the scenario, so a steady drift of the
/// shared machine falls on all alike. A target the scenario does not measure is skipped.
fn plan(duration: Duration) -> [(usize, Duration); 7] {
    let first = duration / 2;
    let second = duration - first;
    [
        (SERVICE, first),
        (STORE, first),
        (FLOOR, first),
        (REFERENCE_FLOOR, duration),
        (FLOOR, second),
        (STORE, second),
        (SERVICE, second),
    ]
}

fn target_name(target: &Target) -> &'static str {
    match target {
        Target::Service { .. } => "tokenmint",
        Target::Store(_) => "store",
        Target::Floor(floor) => floor.design().name(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_target_gets_the_full_duration_centred_on_the_middle() {
        let duration = Duration::from_millis(15_001);
        let plan = plan(duration);
        let total: Duration = plan.iter().map(|(_, d)| *d).sum();
        for target in [SERVICE, STORE, FLOOR, REFERENCE_FLOOR] {
            let (mut start, mut measured, mut moment) = (0.0, 0.0, 0.0);
            for (which, segment) in plan {
                let length = segment.as_secs_f64();
                if which == target {
                    measured += length;
                    moment += length * (start + length / 2.0);
                }
                start += length;
            }
            assert!((measured - duration.as_secs_f64()).abs() < 1e-9);
            let centre = moment / measured;
            assert!((centre - total.as_secs_f64() / 2.0).abs() < 1e-3);
        }
    }
}
