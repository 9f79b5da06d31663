package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"

	"github.com/sbclaim/sbclaim"
)

// budgetCheckTimeout bounds the start-up read of the entity's
// MaxDeliveryCount: a processor without Manage rights, or one that cannot
// reach the administration endpoint, starts after at most this long.
const budgetCheckTimeout = 5 * time.Second

// emulatorSkip is why the processor does not try to read the entity on the
// Service Bus emulator: the SDK's administration client does not speak to
// it (it goes to HTTPS on port 443, where the emulator does not listen).
const emulatorSkip = "the connection string is for the development emulator, which this administration client cannot reach"

// newEntityAdmin returns the administration client for the budget check,
// or why there is none. Its failure never stops the processor: the check
// then only warns.
func newEntityAdmin(cfg *Config, cred azcore.TokenCredential) (sbclaim.EntityAdmin, string) {
	opts := &admin.ClientOptions{ClientOptions: azcore.ClientOptions{
		// One retry: the whole read is bounded by budgetCheckTimeout.
		Retry: policy.RetryOptions{MaxRetries: 1},
	}}
	if cfg.ConnectionString != "" {
		if isEmulator(cfg.ConnectionString) {
			return nil, emulatorSkip
		}
		a, err := admin.NewClientFromConnectionString(cfg.ConnectionString, opts)
		if err != nil {
			// The SDK's message may quote the string: never pass it on.
			return nil, "the administration client rejected the connection string"
		}
		return a, ""
	}
	a, err := admin.NewClient(cfg.Namespace, cred, opts)
	if err != nil {
		return nil, "administration client: " + err.Error()
	}
	return a, ""
}

// isEmulator reports whether a connection string says
// UseDevelopmentEmulator=true.
func isEmulator(cs string) bool {
	for _, part := range strings.Split(cs, ";") {
		k, v, _ := strings.Cut(part, "=")
		if strings.EqualFold(strings.TrimSpace(k), "UseDevelopmentEmulator") {
			b, err := strconv.ParseBool(strings.TrimSpace(v))
			return err == nil && b
		}
	}
	return false
}

// resolveMaxDeliveryCount returns the MaxDeliveryCount the processor runs
// with. The hand-off before the broker's last delivery counts deliveries
// by it, so it must be the entity's: it reads the entity's through a
// (skip, when non-empty, says why there is no a) and
//
//   - refuses to start (a *ConfigError about SBCLAIM_MAX_DELIVERY_COUNT,
//     with both values) when the setting differs from the entity's;
//   - uses the entity's when SBCLAIM_MAX_DELIVERY_COUNT is unset;
//   - when the entity cannot be read (no Manage rights: the least-privilege
//     Data Receiver identity cannot), logs one warning saying the budget
//     was not checked and what is assumed, and goes on with the setting
//     (unset: sbclaim.DefaultMaxDeliveryCount).
func resolveMaxDeliveryCount(ctx context.Context, cfg *Config, a sbclaim.EntityAdmin, skip string, logger *slog.Logger) (int, error) {
	entity := sbclaim.EntityName{Queue: cfg.Queue, Topic: cfg.Topic, Subscription: cfg.Subscription}
	var budget sbclaim.DeliveryBudget
	if skip != "" {
		budget = sbclaim.DeliveryBudget{MaxDeliveryCount: cmp.Or(cfg.MaxDeliveryCount, sbclaim.DefaultMaxDeliveryCount), Unchecked: errors.New(skip)}
	} else {
		rctx, cancel := context.WithTimeout(ctx, budgetCheckTimeout)
		var err error
		budget, err = sbclaim.CheckMaxDeliveryCount(rctx, a, entity, cfg.MaxDeliveryCount)
		cancel()
		var mismatch *sbclaim.DeliveryCountMismatchError
		if errors.As(err, &mismatch) {
			return 0, &ConfigError{Field: "SBCLAIM_MAX_DELIVERY_COUNT", Value: strconv.Itoa(mismatch.Configured),
				Err: fmt.Errorf("entity %s has MaxDeliveryCount %d: set SBCLAIM_MAX_DELIVERY_COUNT=%d, or leave it unset to use the entity's "+
					"(the processor hands a claim to the reconciler before the broker's last delivery, counting deliveries by this setting)",
					mismatch.Entity, mismatch.Actual, mismatch.Actual)}
		}
		if err != nil {
			return 0, err
		}
	}
	if budget.Checked {
		source := "SBCLAIM_MAX_DELIVERY_COUNT matches the entity"
		if cfg.MaxDeliveryCount == 0 {
			source = "read from the entity (SBCLAIM_MAX_DELIVERY_COUNT unset)"
		}
		logger.Info("delivery budget checked", "entity", entity.String(), "max_delivery_count", budget.MaxDeliveryCount, "source", source)
		return budget.MaxDeliveryCount, nil
	}
	assumed := "SBCLAIM_MAX_DELIVERY_COUNT"
	if cfg.MaxDeliveryCount == 0 {
		assumed = "the default, SBCLAIM_MAX_DELIVERY_COUNT being unset"
	}
	logger.Warn(fmt.Sprintf("delivery budget not checked: could not read the MaxDeliveryCount of entity %s (%v); assuming %d (%s). "+
		"If the entity allows fewer deliveries, a long downstream outage dead-letters messages the processor believes have deliveries left: "+
		"make SBCLAIM_MAX_DELIVERY_COUNT the entity's MaxDeliveryCount",
		entity, budget.Unchecked, budget.MaxDeliveryCount, assumed),
		"entity", entity.String(), "max_delivery_count", budget.MaxDeliveryCount, "reason", budget.Unchecked.Error())
	return budget.MaxDeliveryCount, nil
}
