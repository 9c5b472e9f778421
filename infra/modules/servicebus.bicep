// Service Bus namespace and the bridge's entities.
//
// The entities (topic, subscriptions, rules, queue) are read from the emulator's Config.json,
// the one place they are defined, so what runs locally and what runs in Azure cannot drift.
// The emulator format uses PascalCase property names; this module maps each of them to its
// ARM name. tests/infra/test_infra_entities.py fails if Config.json gains a property this module
// does not map.

@description('Azure region of the namespace.')
param location string

@description('Name of the Service Bus namespace (globally unique).')
param namespaceName string

@description('Service Bus tier. Standard is enough for the bridge; Premium adds isolation, zone redundancy and private endpoints.')
@allowed([
  'Standard'
  'Premium'
])
param skuName string = 'Standard'

@description('Messaging units when skuName is Premium (ignored for Standard).')
@allowed([
  1
  2
  4
  8
  16
])
param premiumCapacity int = 1

@description('Duplicate detection window of the scheduled-events topic (ISO 8601). Deterministic message ids collapse the N forwarders that see one event within this window.')
param topicDuplicateDetectionWindow string = 'P1D'

@description('Subscriptions of Config.json not to deploy (teams, when Teams is off): a subscription nobody reads fills up and dead-letters.')
param omittedSubscriptionNames array = []

@description('Tags for every resource.')
param tags object = {}

var entities = loadJsonContent('../servicebus-emulator/Config.json', '$.UserConfig.Namespaces[0]')
var topicConfig = entities.Topics[0]
var queueConfig = entities.Queues[0]
// lb-pools' drain moments: messages the Function App schedules to itself (no sessions).
var drainQueueConfig = entities.Queues[1]

resource namespace 'Microsoft.ServiceBus/namespaces@2022-10-01-preview' = {
  name: namespaceName
  location: location
  tags: tags
  sku: {
    name: skuName
    tier: skuName
    capacity: skuName == 'Premium' ? premiumCapacity : null
  }
  properties: {
    // Entra ID only: SAS keys and connection strings are refused by the namespace.
    disableLocalAuth: true
    minimumTlsVersion: '1.2'
    publicNetworkAccess: 'Enabled'
  }
}

resource topic 'Microsoft.ServiceBus/namespaces/topics@2022-10-01-preview' = {
  parent: namespace
  name: topicConfig.Name
  properties: {
    defaultMessageTimeToLive: topicConfig.Properties.DefaultMessageTimeToLive
    duplicateDetectionHistoryTimeWindow: topicDuplicateDetectionWindow
    requiresDuplicateDetection: topicConfig.Properties.RequiresDuplicateDetection
  }
}

// One module per subscription: it owns the subscription and its rules (Bicep loops cannot
// nest, and the checkov parser does not take lambdas, so no flatten(map(...)) here). Names run
// to 50 characters, deployment names to 64: cut and made unique again with a hash.
// An omitted subscription's module deploys nothing (pycep-parser, which the infra tests read the
// templates with, takes no `if` inside a loop).
module subscriptions 'servicebus-subscription.bicep' = [for s in topicConfig.Subscriptions: {
  name: '${take('sb-subscription-${s.Name}', 50)}-${uniqueString(s.Name)}'
  params: {
    namespaceName: namespace.name
    topicName: topic.name
    subscription: s
    deploy: !contains(omittedSubscriptionNames, s.Name)
  }
}]

resource queue 'Microsoft.ServiceBus/namespaces/queues@2022-10-01-preview' = {
  parent: namespace
  name: queueConfig.Name
  properties: {
    deadLetteringOnMessageExpiration: queueConfig.Properties.DeadLetteringOnMessageExpiration
    defaultMessageTimeToLive: queueConfig.Properties.DefaultMessageTimeToLive
    duplicateDetectionHistoryTimeWindow: queueConfig.Properties.DuplicateDetectionHistoryTimeWindow
    forwardDeadLetteredMessagesTo: empty(queueConfig.Properties.ForwardDeadLetteredMessagesTo) ? null : queueConfig.Properties.ForwardDeadLetteredMessagesTo
    forwardTo: empty(queueConfig.Properties.ForwardTo) ? null : queueConfig.Properties.ForwardTo
    lockDuration: queueConfig.Properties.LockDuration
    maxDeliveryCount: queueConfig.Properties.MaxDeliveryCount
    requiresDuplicateDetection: queueConfig.Properties.RequiresDuplicateDetection
    requiresSession: queueConfig.Properties.RequiresSession
  }
}

resource drainQueue 'Microsoft.ServiceBus/namespaces/queues@2022-10-01-preview' = {
  parent: namespace
  name: drainQueueConfig.Name
  properties: {
    deadLetteringOnMessageExpiration: drainQueueConfig.Properties.DeadLetteringOnMessageExpiration
    defaultMessageTimeToLive: drainQueueConfig.Properties.DefaultMessageTimeToLive
    duplicateDetectionHistoryTimeWindow: drainQueueConfig.Properties.DuplicateDetectionHistoryTimeWindow
    forwardDeadLetteredMessagesTo: empty(drainQueueConfig.Properties.ForwardDeadLetteredMessagesTo) ? null : drainQueueConfig.Properties.ForwardDeadLetteredMessagesTo
    forwardTo: empty(drainQueueConfig.Properties.ForwardTo) ? null : drainQueueConfig.Properties.ForwardTo
    lockDuration: drainQueueConfig.Properties.LockDuration
    maxDeliveryCount: drainQueueConfig.Properties.MaxDeliveryCount
    requiresDuplicateDetection: drainQueueConfig.Properties.RequiresDuplicateDetection
    requiresSession: drainQueueConfig.Properties.RequiresSession
  }
}

@description('Name of the namespace.')
output namespaceName string = namespace.name

@description('Fully qualified namespace: the host name identity-based clients connect to.')
output fullyQualifiedNamespace string = split(split(namespace.properties.serviceBusEndpoint, '//')[1], ':')[0]

@description('Name of the topic the forwarders publish to.')
output topicName string = topic.name

@description('Name of the queue that carries approval commands to the forwarders.')
output approvalsQueueName string = queue.name

@description('Name of the queue lb-pools schedules its drain moments on (to itself).')
output drainMomentsQueueName string = drainQueue.name

@description('Names of all subscriptions of the topic.')
output subscriptionNames array = [for s in topicConfig.Subscriptions: s.Name]
