/*
 * datahelix/datahelix.h - umbrella header: the whole public C API.
 */
#ifndef DATAHELIX_DATAHELIX_H
#define DATAHELIX_DATAHELIX_H

#include "datahelix/arena.h"
#include "datahelix/batch.h"
#include "datahelix/coordinator.h"
#include "datahelix/client.h"
#include "datahelix/dataserver.h"
#include "datahelix/error.h"
#include "datahelix/estimate.h"
#include "datahelix/gendata.h"
#include "datahelix/index.h"
#include "datahelix/inflight.h"
#include "datahelix/media.h"
#include "datahelix/place.h"
#include "datahelix/plan.h"
#include "datahelix/probe.h"
#include "datahelix/reorder.h"
#include "datahelix/table.h"
#include "datahelix/wire.h"
#include "datahelix/workers.h"

#endif
