"""Replaces the SDK's servicebus_preparer.py: see peer_harness.py."""

import functools

from peer_harness import (
    ENDPOINT_SUFFIX,
    AuthorizationRulePreparer,
    NamespacePreparer,
    QueuePreparer,
    ResourceGroupPreparer,
    SubscriptionPreparer,
    TopicPreparer,
)

SERVICEBUS_ENDPOINT_SUFFIX = ENDPOINT_SUFFIX
SERVICEBUS_DEFAULT_AUTH_RULE_NAME = "RootManageSharedAccessKey"
SERVICEBUS_NAMESPACE_PARAM = "servicebus_namespace"
SERVICEBUS_TOPIC_PARAM = "servicebus_topic"
SERVICEBUS_SUBSCRIPTION_PARAM = "servicebus_subscription"
SERVICEBUS_QUEUE_PARAM = "servicebus_queue"
SERVICEBUS_AUTHORIZATION_RULE_PARAM = "servicebus_authorization_rule"
SERVICEBUS_QUEUE_AUTHORIZATION_RULE_PARAM = "servicebus_queue_authorization_rule"
ServiceBusResourceGroupPreparer = ResourceGroupPreparer
ServiceBusNamespacePreparer = NamespacePreparer
ServiceBusTopicPreparer = TopicPreparer
ServiceBusSubscriptionPreparer = SubscriptionPreparer
ServiceBusQueuePreparer = QueuePreparer
ServiceBusNamespaceAuthorizationRulePreparer = AuthorizationRulePreparer
ServiceBusQueueAuthorizationRulePreparer = AuthorizationRulePreparer
CachedServiceBusResourceGroupPreparer = functools.partial(ResourceGroupPreparer, use_cache=True)
CachedServiceBusNamespacePreparer = functools.partial(NamespacePreparer, use_cache=True)
CachedServiceBusQueuePreparer = functools.partial(QueuePreparer, use_cache=True)
CachedServiceBusTopicPreparer = functools.partial(TopicPreparer, use_cache=True)
CachedServiceBusSubscriptionPreparer = functools.partial(SubscriptionPreparer, use_cache=True)
